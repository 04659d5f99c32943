// ts_collective_node: one participant of a collective operation as a process, for the
// functional tests and the benchmark (docs/collective.md "Node tool"). It connects to the group
// named in a file, runs the operation a number of times, reports each run as a JSON line and
// writes the last result. With --retry a failed operation is run again on a new mesh without
// the member the failure names, as a shard's round would.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/absl_view.h"
#include "common/clock.h"
#include "common/crypto/hash.h"
#include "common/crypto/tls_identity.h"
#include "common/crypto/tls_session.h"
#include "common/hex.h"
#include "common/key_file.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "sidecar/collective/collective.h"
#include "sidecar/collective/tcp_transport.h"
#ifdef TS_HAVE_GLOO
#include "sidecar/collective/gloo_collective.h"
#endif

namespace ts::sidecar {
namespace {

struct Flags {
  std::string engine = "ts";
  size_t index = 0;
  std::string group_file;
  std::string key_file;
  std::string tls_dir;
  std::string chain_id = "trainshard-devnet";
  uint64_t shard = 1;
  std::string listen;
  std::string op = "allreduce";
  size_t elements = 1024;
  std::string dtype = "f32";
  std::string reduce = "mean";
  std::string codec = "fp32";
  uint32_t block = 4096;
  uint32_t topk = 64;
  uint32_t value_bits = 2;
  std::string aggregator = "mean";
  uint32_t trim = 0;
  float clip_tau = 0;
  std::string input;
  uint64_t seed = 1;
  std::string output;
  int iterations = 1;
  bool retry = false;
  int64_t deadline_ms = 60000;
  int64_t heartbeat_ms = 500;
  int64_t dead_after_ms = 0;
  int64_t start_at_unix_ms = 0;
  uint32_t chunk_elements = 256u << 10;
  size_t measure_ring_bytes = 0;
  std::string report;
  // Gloo
  std::string store_dir;
  std::string bind_ip = "127.0.0.1";
  int size = 0;
};

// Wall-clock milliseconds with microsecond resolution: when an operation was entered and left,
// so a benchmark on one machine can time an operation from the last member's entry to the last
// member's exit.
double UnixMsPrecise() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Deterministic input: element e of member `index` from splitmix64(seed, index, e), a multiple
// of 2^-23 in [-1, 1) (exact in fp32), so a test can rebuild it independently.
float SeededValue(uint64_t seed, uint64_t index, uint64_t e) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index * 0xD1B54A32D192ED03ull + e;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z = z ^ (z >> 31);
  return static_cast<float>(static_cast<int64_t>(z >> 40) - (1ll << 23)) / 8388608.0f;
}

absl::StatusOr<std::vector<GroupMember>> ReadGroup(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--group: cannot open '", path, "'"));
  std::vector<GroupMember> members;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    GroupMember m;
    if (!(fields >> m.address >> m.endpoint)) continue;
    // An optional third field: the hex SHA-256 of the member's TLS certificate (--tls-dir).
    std::string cert_hex;
    if (fields >> cert_hex) {
      absl::StatusOr<std::string> cert = common::HexDecode(cert_hex);
      if (!cert.ok() || cert->size() != common::kSha256Size) {
        return absl::InvalidArgumentError(
            absl::StrCat("--group: '", cert_hex, "' of ", m.address, " is not a SHA-256 in hex"));
      }
      m.tls_cert_sha256 = *std::move(cert);
    }
    members.push_back(m);
  }
  return members;
}

absl::StatusOr<std::vector<float>> ReadInput(const Flags& f) {
  std::vector<float> data(f.elements);
  if (f.input.empty()) {
    for (size_t e = 0; e < f.elements; ++e) data[e] = SeededValue(f.seed, f.index, e);
    return data;
  }
  std::ifstream in(f.input, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--input: cannot open '", f.input, "'"));
  in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(data.size() * 4));
  if (static_cast<size_t>(in.gcount()) != data.size() * 4) {
    return absl::InvalidArgumentError(absl::StrCat("--input: '", f.input, "' holds ", in.gcount(),
                                                   " bytes, expected ", data.size() * 4));
  }
  return data;
}

absl::Status WriteOutput(const std::string& path, std::string_view bytes) {
  if (path.empty()) return absl::OkStatus();
  std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out || std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("--output: cannot write '", path, "'"));
  }
  return absl::OkStatus();
}

class Reporter {
 public:
  explicit Reporter(const std::string& path) {
    if (!path.empty()) out_.open(path, std::ios::app);
  }
  void Write(const nlohmann::json& line) {
    std::string text = line.dump();
    std::cout << text << std::endl;
    if (out_.is_open()) out_ << text << std::endl;
  }

 private:
  std::ofstream out_;
};

void SleepUntilUnixMs(int64_t t) {
  common::Clock& clock = common::SystemClock();
  while (t > 0) {
    int64_t left = t - clock.NowUnixMs();
    if (left <= 0) break;
    clock.SleepMs(std::min<int64_t>(left, 50));
  }
}

// Measures every pair's rate on the connected mesh, then reconnects with the members in the
// ring order chosen from the measurements (every member computes the same order).
absl::Status MeasureAndReorder(const Flags& f, const common::PrivateKey* key, common::Clock& clock,
                               TcpTransport* transport, GroupSpec* group, uint64_t* session,
                               std::unique_ptr<Mesh>* mesh, Reporter* reporter) {
  Collective collective(mesh->get(), key, f.chain_id, &clock);
  OpOptions op;
  op.op_id = uint64_t{1} << 40;
  op.deadline_ms = clock.MonotonicMs() + f.deadline_ms;
  std::vector<std::vector<double>> rates;
  TS_ASSIGN_OR_RETURN(std::vector<size_t> order,
                      collective.MeasureRingOrder(op, f.measure_ring_bytes, &rates));
  std::vector<GroupMember> ordered;
  nlohmann::json addresses = nlohmann::json::array();
  for (size_t i : order) {
    ordered.push_back(group->members[i]);
    addresses.push_back(group->members[i].address);
  }
  reporter->Write({{"ring_order", addresses}, {"rates_bytes_per_s", rates}});
  mesh->reset();
  group->members = std::move(ordered);
  group->session = ++*session;
  size_t self_index = 0;
  while (group->members[self_index].address != transport->address()) ++self_index;
  TS_ASSIGN_OR_RETURN(*mesh,
                      transport->Connect(*group, self_index, clock.MonotonicMs() + f.deadline_ms));
  return absl::OkStatus();
}

int RunTs(const Flags& f) {
  common::Clock& clock = common::SystemClock();
  Reporter reporter(f.report);
  auto fail_setup = [&](const absl::Status& s) {
    reporter.Write({{"ok", false}, {"error", std::string(s.ToString())}, {"engine", "ts"}});
    return 1;
  };
  absl::StatusOr<common::PrivateKey> key = common::ReadKeyFile(f.key_file);
  if (!key.ok()) return fail_setup(key.status());
  absl::StatusOr<std::vector<GroupMember>> members = ReadGroup(f.group_file);
  if (!members.ok()) return fail_setup(members.status());
  if (f.index >= members->size()) {
    return fail_setup(absl::InvalidArgumentError(
        absl::StrCat("--index: ", f.index, " is outside the group of ", members->size())));
  }
  TcpTransportOptions options;
  options.listen_address = f.listen.empty() ? (*members)[f.index].endpoint : f.listen;
  options.chain_id = f.chain_id;
  options.heartbeat_interval_ms = f.heartbeat_ms;
  options.dead_after_ms = f.dead_after_ms;
  if (!f.tls_dir.empty()) {
    absl::StatusOr<common::TlsIdentity> identity = common::LoadTlsIdentity(f.tls_dir);
    if (!identity.ok()) return fail_setup(identity.status());
    absl::StatusOr<std::shared_ptr<const common::TlsContext>> tls =
        common::TlsContext::New(*identity);
    if (!tls.ok()) return fail_setup(tls.status());
    options.tls = *std::move(tls);
  }
  auto transport = TcpTransport::Start(*key, options, &clock);
  if (!transport.ok()) return fail_setup(transport.status());

  absl::StatusOr<std::vector<float>> input = ReadInput(f);
  if (!input.ok()) return fail_setup(input.status());
  absl::StatusOr<Compression> compression = ParseCompression(f.codec);
  if (!compression.ok()) return fail_setup(compression.status());
  absl::StatusOr<Aggregator> aggregator = ParseAggregator(f.aggregator);
  if (!aggregator.ok()) return fail_setup(aggregator.status());

  GroupSpec group;
  group.shard_id = f.shard;
  group.members = *members;
  const std::string self = (*transport)->address();
  uint64_t session = 1;
  std::unique_ptr<Mesh> mesh;
  bool last_ok = false;
  bool first_mesh = true;
  // Set after a failure: the retry mesh first agrees on the iteration to resume from.
  bool resume = false;
  int attempts_left = f.retry ? static_cast<int>(group.members.size()) - 2 : 0;
  std::string result;
  std::vector<float> data;
  int it = 0;
  while (it < f.iterations) {
    absl::Status status;
    OpStats stats;
    size_t self_index = 0;
    while (self_index < group.members.size() && group.members[self_index].address != self) {
      ++self_index;
    }
    if (!mesh) {
      group.session = session;
      auto connected =
          (*transport)->Connect(group, self_index, clock.MonotonicMs() + f.deadline_ms);
      if (connected.ok()) {
        mesh = std::move(*connected);
        if (resume) {
          // Op id 0 is never an iteration's (those are it + 1).
          Collective agree(mesh.get(), &*key, f.chain_id, &clock);
          OpOptions op;
          op.op_id = 0;
          op.deadline_ms = clock.MonotonicMs() + f.deadline_ms;
          absl::StatusOr<uint64_t> least = agree.MinimumOf(op, static_cast<uint64_t>(it));
          if (least.ok()) {
            it = static_cast<int>(*least);  // at most `it`: this member's value is in it
            resume = false;
          } else {
            status = least.status();
          }
        }
        if (status.ok() && first_mesh && f.measure_ring_bytes > 0) {
          status = MeasureAndReorder(f, &*key, clock, transport->get(), &group, &session, &mesh,
                                     &reporter);
        }
        if (status.ok() && first_mesh) SleepUntilUnixMs(f.start_at_unix_ms);
        first_mesh = false;
      } else {
        status = connected.status();
      }
    }
    nlohmann::json line = {{"iteration", it},
                           {"engine", "ts"},
                           {"codec", f.codec},
                           {"op", f.op},
                           {"elements", f.elements}};
    nlohmann::json addresses = nlohmann::json::array();
    for (const auto& m : group.members) addresses.push_back(m.address);
    line["members"] = addresses;
    data = *input;  // into the capacity of the last iteration's buffer, as the Gloo engine does
    if (status.ok()) {
      Collective collective(mesh.get(), &*key, f.chain_id, &clock);
      OpOptions op;
      op.op_id = static_cast<uint64_t>(it) + 1;
      op.codec.kind = *compression;
      op.codec.block_elements = f.block;
      op.codec.topk_per_block = f.topk;
      op.codec.value_bits = f.value_bits;
      op.reduce = f.reduce == "sum" ? ReduceOp::kSum : ReduceOp::kMean;
      op.deadline_ms = clock.MonotonicMs() + f.deadline_ms;
      op.chunk_elements = f.chunk_elements;
      // Buffers are made before the entry stamp and results copied after the exit stamp, so
      // the two bracket the operation alone.
      const bool gather = f.op == "allgather";
      const bool robust = !gather && f.op == "robust";
      const bool bf16 = !gather && !robust && f.dtype == "bf16";
      std::string gathered(gather ? group.members.size() * data.size() * 4 : 0, '\0');
      std::vector<uint16_t> bf(bf16 ? data.size() : 0);
      for (size_t e = 0; e < bf.size(); ++e) bf[e] = FloatToBf16(data[e]);
      AggregateSpec aggregate;
      aggregate.kind = *aggregator;
      aggregate.trim = f.trim;
      aggregate.clip_tau = f.clip_tau;
      absl::StatusOr<OpStats> done;
      line["started_unix_ms"] = UnixMsPrecise();
      if (gather) {
        done = collective.AllGather(
            op, std::span<const char>(reinterpret_cast<const char*>(data.data()), data.size() * 4),
            std::span<char>(gathered.data(), gathered.size()));
      } else if (robust) {
        done = collective.RobustAllReduce(op, aggregate, data);
      } else if (bf16) {
        done = collective.AllReduceBf16(op, bf);
      } else {
        done = collective.AllReduce(op, data);
      }
      line["ended_unix_ms"] = UnixMsPrecise();
      if (done.ok()) {
        stats = *done;
        // Only the last operation's result is written out; copying every one would load the
        // CPU the other members are still using.
        const bool last = it + 1 == f.iterations;
        if (last && gather) {
          result = std::move(gathered);
        } else if (last && bf16) {
          result.assign(reinterpret_cast<const char*>(bf.data()), bf.size() * 2);
        } else if (last) {
          result.assign(reinterpret_cast<const char*>(data.data()), data.size() * 4);
        }
      } else {
        status = done.status();
      }
    }
    line["ok"] = status.ok();
    if (status.ok()) {
      line["seconds"] = stats.seconds;
      line["raw_bytes"] = stats.raw_bytes;
      line["payload_bytes_sent"] = stats.payload_bytes_sent;
      line["wire_bytes_sent"] = stats.wire_bytes_sent;
      line["payload_bytes_received"] = stats.payload_bytes_received;
      reporter.Write(line);
      last_ok = true;
      ++it;
      continue;
    }
    std::string failed = FailedPeerOf(status);
    line["error"] = std::string(status.ToString());
    line["failed_peer"] = failed;
    line["failed_at_unix_ms"] = clock.NowUnixMs();
    reporter.Write(line);
    last_ok = false;
    mesh.reset();
    ++session;
    // Retry without the member at fault, unless it is this host or unknown.
    size_t at = 0;
    while (at < group.members.size() && group.members[at].address != failed) ++at;
    if (attempts_left-- <= 0 || failed == self || at == group.members.size()) break;
    group.members.erase(group.members.begin() + static_cast<std::ptrdiff_t>(at));
    resume = true;
  }
  mesh.reset();
  if (last_ok) {
    if (absl::Status s = WriteOutput(f.output, result); !s.ok()) return fail_setup(s);
  }
  return last_ok ? 0 : 1;
}

#ifdef TS_HAVE_GLOO
int RunGloo(const Flags& f) {
  Reporter reporter(f.report);
  GlooOptions options;
  options.rank = static_cast<int>(f.index);
  options.size = f.size;
  options.store_dir = f.store_dir;
  options.prefix = "bench";
  options.bind_ip = f.bind_ip;
  options.timeout_ms = f.deadline_ms;
  auto gloo = GlooCollective::Connect(options);
  if (!gloo.ok()) {
    reporter.Write(
        {{"ok", false}, {"error", std::string(gloo.status().ToString())}, {"engine", "gloo"}});
    return 1;
  }
  absl::StatusOr<std::vector<float>> input = ReadInput(f);
  if (!input.ok()) return 1;
  SleepUntilUnixMs(f.start_at_unix_ms);
  std::vector<float> data;
  for (int it = 0; it < f.iterations; ++it) {
    data = *input;
    const double started_unix_ms = UnixMsPrecise();
    auto start = std::chrono::steady_clock::now();
    absl::Status status = (*gloo)->AllReduce(data, f.reduce == "mean");
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    nlohmann::json line = {{"iteration", it},
                           {"engine", "gloo"},
                           {"ok", status.ok()},
                           {"elements", f.elements},
                           {"raw_bytes", f.elements * 4},
                           {"started_unix_ms", started_unix_ms},
                           {"ended_unix_ms", UnixMsPrecise()}};
    if (status.ok()) {
      line["seconds"] = seconds;
    } else {
      line["error"] = std::string(status.ToString());
    }
    reporter.Write(line);
    if (!status.ok()) return 1;
  }
  std::string bytes(reinterpret_cast<const char*>(data.data()), data.size() * 4);
  return WriteOutput(f.output, bytes).ok() ? 0 : 1;
}
#endif

}  // namespace
}  // namespace ts::sidecar

int main(int argc, char** argv) {
  ts::sidecar::Flags f;
  CLI::App app{"One participant of a trainshard collective operation"};
  app.add_option("--engine", f.engine, "ts | gloo")->check(CLI::IsMember({"ts", "gloo"}));
  app.add_option("--index", f.index, "this member's index in the group")->required();
  app.add_option("--group", f.group_file, "file of 'address endpoint' lines (engine ts)");
  app.add_option("--key-file", f.key_file, "this host's key file (engine ts)");
  app.add_option("--tls-dir", f.tls_dir,
                 "TLS with the identity in DIR (tls.key, tls.crt), every member pinned to the "
                 "SHA-256 in the group file's third column (engine ts)");
  app.add_option("--chain-id", f.chain_id);
  app.add_option("--shard", f.shard);
  app.add_option("--listen", f.listen, "host:port (default: this member's endpoint)");
  app.add_option("--op", f.op)->check(CLI::IsMember({"allreduce", "allgather", "robust"}));
  app.add_option("--elements", f.elements, "fp32 elements per member");
  app.add_option("--dtype", f.dtype)->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--reduce", f.reduce)->check(CLI::IsMember({"sum", "mean"}));
  app.add_option("--codec", f.codec, "fp32 | fp32-zstd | fp16 | bf16 | int8 | int8-zstd | topk");
  app.add_option("--block", f.block);
  app.add_option("--topk", f.topk);
  app.add_option("--value-bits", f.value_bits);
  app.add_option("--aggregator", f.aggregator, "mean | median | trimmed_mean | centered_clip");
  app.add_option("--trim", f.trim);
  app.add_option("--clip-tau", f.clip_tau);
  app.add_option("--input", f.input, "raw little-endian fp32 input (default: seeded)");
  app.add_option("--seed", f.seed);
  app.add_option("--output", f.output, "where the last result's raw bytes go");
  app.add_option("--iterations", f.iterations)->check(CLI::PositiveNumber);
  app.add_flag("--retry", f.retry, "after a failure, run again without the member at fault");
  app.add_option("--deadline-ms", f.deadline_ms);
  app.add_option("--heartbeat-ms", f.heartbeat_ms);
  app.add_option("--dead-after-ms", f.dead_after_ms);
  app.add_option("--start-at-unix-ms", f.start_at_unix_ms);
  app.add_option("--chunk-elements", f.chunk_elements);
  app.add_option("--measure-ring-bytes", f.measure_ring_bytes,
                 "measure pair rates with this many bytes and order the ring by them");
  app.add_option("--report", f.report, "append one JSON line per operation here");
  app.add_option("--store-dir", f.store_dir, "Gloo FileStore directory");
  app.add_option("--bind-ip", f.bind_ip, "Gloo: address to bind");
  app.add_option("--size", f.size, "Gloo: group size");
  CLI11_PARSE(app, argc, argv);
  if (f.engine == "gloo") {
#ifdef TS_HAVE_GLOO
    return ts::sidecar::RunGloo(f);
#else
    std::cerr << "--engine gloo: this build has no Gloo (install libgloo-dev)\n";
    return 2;
#endif
  }
  return ts::sidecar::RunTs(f);
}
