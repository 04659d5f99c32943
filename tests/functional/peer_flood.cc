// ts_peer_flood: an outsider flooding a host's peer listener, for the hardening suite
// (tests/functional/test_hardening.py). Test-only; not installed.
//
// For --duration-ms it
// - sends validly signed peer requests (ListArtifacts, GetManifest) to --target from --threads
//   threads, as fast as each gets its answers: even threads sign with --outsider-key (an
//   account that is not a member of the shard), odd threads with a new random key for every
//   request (a key of no account at all); every --random-shard-every'th request names a random
//   shard id instead of --shard;
// - holds --idle connections to the chunk stream at --stream that never send a byte, each
//   reopened --reopen-delay-ms after the host closes it;
// - with --probe-key (a member's key), sends that member's signed ListArtifacts every
//   --probe-every-ms and records how each fared.
// Then it prints one JSON line: requests sent, answers by status code, idle connections opened
// and closed by the host, the most held at once, and the probes' outcomes and latencies.
//
// Thread-safety: one process, its threads share only atomics and the report's mutex.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/crypto/bech32.h"
#include "common/crypto/secp256k1.h"
#include "common/hex.h"
#include "common/key_file.h"
#include "gonka/trainshard/v1/shard.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "sidecar/artifacts/chunk_stream.h"
#include "sidecar/artifacts/transfer.h"
#include "sidecar/peer/peer_auth.h"
#include "sidecar/peer/peer_tls.h"

namespace ts::sidecar {
namespace {

// Every call's deadline: a host that stops answering shows up as DEADLINE_EXCEEDED.
constexpr int64_t kCallDeadlineMs = 5000;

struct Flags {
  std::string target;
  std::string audience;
  std::string chain_id;
  uint64_t shard = 0;
  std::string artifact;  // hex; GetManifest asks for it (else a made-up id)
  std::string outsider_key;
  int threads = 4;
  int random_shard_every = 0;
  int64_t duration_ms = 10000;
  std::string stream;  // host:port of the chunk stream
  int idle = 0;
  int64_t reopen_delay_ms = 20;
  std::string probe_key;
  int64_t probe_every_ms = 250;
  std::string tls_sha256;  // hex; when set, TLS to --target pinned to this certificate
};

// The channel to the host's peer listener: TLS pinned to --tls-sha256, as a member's would be,
// or in the clear.
std::shared_ptr<grpc::Channel> PeerChannel(const Flags& f) {
  std::string pin;
  if (!f.tls_sha256.empty()) pin = common::HexDecode(f.tls_sha256).value_or(std::string(32, '\0'));
  return grpc::CreateChannel(f.target, PeerChannelCredentials(pin));
}

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

int64_t NowMs() { return common::SystemClock().MonotonicMs(); }

// Answers by status code, from every flooding thread.
class Tally {
 public:
  void Add(const std::string& code) {
    absl::MutexLock lock(&mu_);
    ++codes_[code];
  }
  std::map<std::string, uint64_t> codes() const {
    absl::MutexLock lock(&mu_);
    return codes_;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, uint64_t> codes_ ABSL_GUARDED_BY(mu_);
};

template <typename Request>
void SignAs(const common::PrivateKey& key, const Flags& f, std::string_view method,
            Request* request) {
  auto auth = SignPeerRequest(key, f.chain_id, request->shard_id(), method, f.audience, *request,
                              common::SystemClock().NowUnixMs(), kDefaultPeerRequestLifetimeMs);
  if (auth.ok()) *request->mutable_auth() = *std::move(auth);
}

void Flood(const Flags& f, int thread, const common::PrivateKey* outsider, int64_t end_ms,
           std::atomic<uint64_t>* sent, Tally* tally) {
  auto stub = pb::ArtifactTransfer::NewStub(PeerChannel(f));
  std::mt19937_64 rng(static_cast<uint64_t>(thread) * 7919 + static_cast<uint64_t>(NowMs()));
  std::string artifact = std::string(32, 'a');
  if (f.artifact.size() == 64) {
    for (size_t i = 0; i < 32; ++i) {
      artifact[i] = static_cast<char>(std::stoi(f.artifact.substr(2 * i, 2), nullptr, 16));
    }
  }
  const bool fresh_keys = outsider == nullptr || thread % 2 == 1;
  for (uint64_t n = 0; NowMs() < end_ms; ++n) {
    const common::PrivateKey key = fresh_keys ? common::PrivateKey::Generate() : *outsider;
    uint64_t shard = f.shard;
    if (f.random_shard_every > 0 && n % static_cast<uint64_t>(f.random_shard_every) == 0) {
      shard = 1000000 + rng() % 1000000000;
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(kCallDeadlineMs));
    grpc::Status status;
    if (n % 2 == 0) {
      pb::ListArtifactsRequest request;
      request.set_shard_id(shard);
      SignAs(key, f, kMethodListArtifacts, &request);
      pb::ListArtifactsResponse response;
      status = stub->ListArtifacts(&context, request, &response);
    } else {
      pb::GetManifestRequest request;
      request.set_shard_id(shard);
      request.set_artifact_id(artifact);
      SignAs(key, f, kMethodGetManifest, &request);
      pb::GetManifestResponse response;
      status = stub->GetManifest(&context, request, &response);
    }
    sent->fetch_add(1);
    tally->Add(CodeName(status.error_code()));
  }
}

// Opens a non-blocking connection to host:port; -1 if it cannot even start.
int StartConnect(const struct addrinfo* to) {
  const int fd = ::socket(to->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, to->ai_addr, to->ai_addrlen) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  return fd;
}

struct IdleReport {
  uint64_t opened = 0;
  uint64_t closed_by_host = 0;
  size_t held_max = 0;
};

// Holds f.idle silent connections to the chunk stream, reopening each after it is closed.
IdleReport HoldIdle(const Flags& f, int64_t end_ms) {
  IdleReport report;
  const std::string host = EndpointHost(f.stream);
  const std::string port = f.stream.substr(f.stream.rfind(':') + 1);
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    std::cerr << "ts_peer_flood: cannot resolve " << f.stream << "\n";
    return report;
  }
  std::vector<int> fds(static_cast<size_t>(f.idle), -1);
  std::vector<int64_t> reopen_at(fds.size(), 0);
  std::vector<struct pollfd> polls;
  while (NowMs() < end_ms) {
    const int64_t now = NowMs();
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i] < 0 && now >= reopen_at[i]) {
        fds[i] = StartConnect(found);
        if (fds[i] >= 0) ++report.opened;
      }
    }
    polls.clear();
    size_t held = 0;
    for (int fd : fds) {
      polls.push_back({fd, POLLIN, 0});
      held += fd >= 0 ? 1 : 0;
    }
    report.held_max = std::max(report.held_max, held);
    if (::poll(polls.data(), polls.size(), 10) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i] < 0 || polls[i].revents == 0) continue;
      // Readable or hung up: the host closed it (it never sends a silent client anything).
      char byte;
      if (::recv(fds[i], &byte, 1, MSG_DONTWAIT) > 0) continue;
      ::close(fds[i]);
      fds[i] = -1;
      reopen_at[i] = NowMs() + f.reopen_delay_ms;
      ++report.closed_by_host;
    }
  }
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
  ::freeaddrinfo(found);
  return report;
}

struct ProbeReport {
  uint64_t ok = 0;
  uint64_t failed = 0;
  int64_t slowest_ms = 0;
  std::vector<std::string> errors;  // the first few
};

// A member's ListArtifacts every f.probe_every_ms.
ProbeReport Probe(const Flags& f, const common::PrivateKey& member, int64_t end_ms) {
  ProbeReport report;
  auto stub = pb::ArtifactTransfer::NewStub(PeerChannel(f));
  while (NowMs() < end_ms) {
    const int64_t start = NowMs();
    pb::ListArtifactsRequest request;
    request.set_shard_id(f.shard);
    SignAs(member, f, kMethodListArtifacts, &request);
    pb::ListArtifactsResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(kCallDeadlineMs));
    grpc::Status status = stub->ListArtifacts(&context, request, &response);
    const int64_t took = NowMs() - start;
    report.slowest_ms = std::max(report.slowest_ms, took);
    if (status.ok()) {
      ++report.ok;
    } else {
      ++report.failed;
      if (report.errors.size() < 5) {
        report.errors.push_back(
            absl::StrCat(CodeName(status.error_code()), ": ", status.error_message()));
      }
    }
    const int64_t wait = f.probe_every_ms - took;
    if (wait > 0) std::this_thread::sleep_for(std::chrono::milliseconds(wait));
  }
  return report;
}

int Run(const Flags& f) {
  std::unique_ptr<common::PrivateKey> outsider;
  if (!f.outsider_key.empty()) {
    auto key = common::ReadKeyFile(f.outsider_key);
    if (!key.ok()) {
      std::cerr << "ts_peer_flood: --outsider-key: " << key.status() << "\n";
      return 2;
    }
    outsider = std::make_unique<common::PrivateKey>(*key);
  }
  std::unique_ptr<common::PrivateKey> member;
  if (!f.probe_key.empty()) {
    auto key = common::ReadKeyFile(f.probe_key);
    if (!key.ok()) {
      std::cerr << "ts_peer_flood: --probe-key: " << key.status() << "\n";
      return 2;
    }
    member = std::make_unique<common::PrivateKey>(*key);
  }
  const int64_t start_ms = NowMs();
  const int64_t end_ms = start_ms + f.duration_ms;
  std::atomic<uint64_t> sent{0};
  Tally tally;
  IdleReport idle;
  ProbeReport probe;
  std::vector<std::thread> threads;
  for (int i = 0; i < f.threads; ++i) {
    threads.emplace_back(Flood, std::cref(f), i, outsider.get(), end_ms, &sent, &tally);
  }
  if (f.idle > 0 && !f.stream.empty()) {
    threads.emplace_back([&] { idle = HoldIdle(f, end_ms); });
  }
  if (member != nullptr) threads.emplace_back([&] { probe = Probe(f, *member, end_ms); });
  for (std::thread& t : threads) t.join();
  const double seconds = static_cast<double>(NowMs() - start_ms) / 1000;

  nlohmann::ordered_json line;
  line["seconds"] = seconds;
  line["sent"] = sent.load();
  line["per_second"] = seconds > 0 ? static_cast<double>(sent.load()) / seconds : 0;
  line["codes"] = tally.codes();
  line["idle_opened"] = idle.opened;
  line["idle_closed_by_host"] = idle.closed_by_host;
  line["idle_held_max"] = idle.held_max;
  line["probe_ok"] = probe.ok;
  line["probe_failed"] = probe.failed;
  line["probe_slowest_ms"] = probe.slowest_ms;
  line["probe_errors"] = probe.errors;
  std::cout << line.dump() << std::endl;
  return 0;
}

}  // namespace
}  // namespace ts::sidecar

int main(int argc, char** argv) {
  ts::sidecar::Flags f;
  CLI::App app{"Floods a trainshard host's peer listener as an outsider (tests only)"};
  app.add_option("--target", f.target, "the host's shard_listen host:port")->required();
  app.add_option("--audience", f.audience, "the host's address")->required();
  app.add_option("--chain-id", f.chain_id)->required();
  app.add_option("--shard", f.shard)->required();
  app.add_option("--artifact", f.artifact, "artifact id (hex) GetManifest asks for");
  app.add_option("--outsider-key", f.outsider_key, "key file of an account outside the shard");
  app.add_option("--threads", f.threads)->check(CLI::Range(0, 64));
  app.add_option("--random-shard-every", f.random_shard_every,
                 "every n-th request names a random shard id (0: never)");
  app.add_option("--duration-ms", f.duration_ms)->check(CLI::PositiveNumber);
  app.add_option("--stream", f.stream, "the host's chunk stream host:port");
  app.add_option("--tls-sha256", f.tls_sha256,
                 "TLS to --target, pinned to this certificate SHA-256 (hex; the host's peer_tls)");
  app.add_option("--idle", f.idle, "silent connections held on --stream")
      ->check(CLI::Range(0, 10000));
  app.add_option("--reopen-delay-ms", f.reopen_delay_ms);
  app.add_option("--probe-key", f.probe_key, "a member's key file: its requests are timed");
  app.add_option("--probe-every-ms", f.probe_every_ms)->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  return ts::sidecar::Run(f);
}
