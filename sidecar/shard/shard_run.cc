#include "sidecar/shard/shard_run.h"

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <future>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/absl_view.h"
#include "common/amount.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/signing.h"
#include "common/hex.h"
#include "common/log.h"
#include "common/protocol.h"
#include "common/status.h"
#include "proto/deterministic.h"
#include "proto/grpc_status.h"
#include "sidecar/collective/collective.h"
#include "sidecar/collective/tcp_transport.h"
#include "sidecar/shard/ledger.h"
#include "sidecar/shard/rendezvous.h"
#include "worker/client/work_dir.h"
#include "worker/client/worker_client.h"
#include "worker/dataset_manifest.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
constexpr char kComponent[] = "shard_run";
constexpr char kCheckpointFile[] = "checkpoint.tsck";
constexpr char kTokenizerFile[] = "tokenizer.model";
// Fixed block sizes of the round's all-gathers (every member sends the same size).
constexpr size_t kVoteBlockBytes = 2048;
constexpr size_t kSettlementBlockBytes = 512;
constexpr int64_t kAnnounceFreshMs = 3000;  // an announce older than this is not counted
constexpr int64_t kRpcTimeoutMs = 5000;
// The least time members of a plan get to connect their mesh (see Exchange).
constexpr int64_t kConnectMinMs = 5000;
// How often a planner without a plan past its window asks a member for newer certificates.
constexpr int64_t kStuckProbeMs = 1000;
// Reconnect backoff of the channels to other members (see StubFor).
constexpr int kReconnectBackoffMinMs = 100;
constexpr int kReconnectBackoffMaxMs = 1000;
constexpr size_t kRoundsKept = 256;
constexpr int kWorkerRestartsMax = 5;

std::string Hex8(std::string_view bytes) { return common::HexEncode(bytes).substr(0, 16); }

std::string RoundKey(uint64_t shard_id, uint64_t round) {
  return state::EncodeU64Key(shard_id) + state::EncodeU64Key(round);
}

std::string CheckpointDir(uint64_t round) { return absl::StrCat("ckpt/r", round); }
// A round's Δ file: by parity, so the Δ of the round in flight and of the next one coexist.
std::string DeltaName(uint64_t round) { return absl::StrCat("delta-", round % 2, ".bin"); }
std::string CheckpointName(uint64_t round) {
  return absl::StrCat(CheckpointDir(round), "/", kCheckpointFile);
}

// Certificates of rounds from..from+max-1 kept in the shard process's records, in round order.
absl::StatusOr<std::vector<pb::RoundCertificate>> LoadStoredCertificates(const state::Db& db,
                                                                         uint64_t shard_id,
                                                                         uint64_t from,
                                                                         uint32_t max) {
  std::vector<pb::RoundCertificate> out;
  absl::Status parse = absl::OkStatus();
  TS_RETURN_IF_ERROR(
      db.ScanFrom(kTableRounds, state::EncodeU64Key(shard_id), RoundKey(shard_id, from),
                  [&](std::string_view, std::string_view value) {
                    pb::RoundCertificate c;
                    if (!c.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
                      parse = absl::DataLossError("a stored round certificate does not parse");
                      return false;
                    }
                    out.push_back(std::move(c));
                    return out.size() < max;
                  }));
  TS_RETURN_IF_ERROR(parse);
  return out;
}

// A block of an all-gather: u32 length (big-endian) then the message, zero-padded.
absl::StatusOr<std::string> PackBlock(const google::protobuf::MessageLite& m, size_t size) {
  std::string body = DeterministicBytes(m);
  if (body.size() + 4 > size) {
    return absl::InternalError(absl::StrCat("block of ", body.size(), " bytes exceeds ", size));
  }
  std::string out(size, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((body.size() >> (8 * (3 - i))) & 0xff);
  std::memcpy(out.data() + 4, body.data(), body.size());
  return out;
}

bool UnpackBlock(std::string_view block, google::protobuf::MessageLite* m) {
  if (block.size() < 4) return false;
  size_t n = 0;
  for (int i = 0; i < 4; ++i) n = (n << 8) | static_cast<unsigned char>(block[i]);
  if (n > block.size() - 4) return false;
  return m->ParseFromArray(block.data() + 4, static_cast<int>(n));
}

std::string Short(const std::string& address) {
  return address.size() > 14 ? address.substr(0, 14) + "…" : address;
}

}  // namespace

struct ShardRun::Impl {
  Impl(const ShardRunHost& h, const ShardRunOptions& o, uint64_t id, ParsedRunSpec s)
      : host(h), options(o), shard_id(id), spec(std::move(s)) {}

  const ShardRunHost host;
  const ShardRunOptions options;
  const uint64_t shard_id;
  const ParsedRunSpec spec;
  std::string dir;       // <work_root>/<shard_id>
  std::string work_dir;  // dir/work: shared with the worker

  // Owned by the run thread (the worker shared with eval_target below).
  std::shared_ptr<worker::WorkerProcess> worker;
  std::unique_ptr<TcpTransport> transport;
  pb::PrepareDataResponse data;
  uint64_t parameters = 0;
  bool loaded = false;  // the worker holds the certified checkpoint
  bool data_published = false;
  int worker_restarts = 0;
  uint64_t delta_round = 0;
  // With overlap: the rounds whose Δ file (DeltaName) holds this host's Δ, computed since the
  // last catch-up (at most the round in flight and the next), with what the steps reported.
  struct DeltaInfo {
    float train_loss = 0;
    double inner_seconds = 0;
  };
  std::map<uint64_t, DeltaInfo> deltas;
  float last_train_loss = 0;
  double round_inner_seconds = 0;
  std::vector<pb::SettlementSignature> settlement_signatures;
  pb::Settlement settlement;
  int64_t start_ms = 0;
  std::map<std::string, std::unique_ptr<pb::ShardRound::Stub>> stubs;

  std::atomic<bool> stopping{false};
  std::atomic<pid_t> worker_pid{0};
  std::thread thread;

  mutable absl::Mutex mu;
  // The meshes in use by the exchange (at most the run thread's and the allreduce in flight):
  // Stop aborts them, so the operations end at once instead of at their deadlines.
  std::set<Mesh*> meshes ABSL_GUARDED_BY(mu);
  // transport.get() once made, for Stop to end the Connects in progress.
  TcpTransport* stop_transport ABSL_GUARDED_BY(mu) = nullptr;
  // The certified state.
  uint64_t certified_round ABSL_GUARDED_BY(mu) = 0;
  std::string certified_root ABSL_GUARDED_BY(mu);
  std::string certified_base_root ABSL_GUARDED_BY(mu);  // the base of certified_round
  std::string checkpoint_artifact ABSL_GUARDED_BY(mu);  // holds certified_root, if published
  // The round this host plans or would plan: the announces it has heard and its plan.
  Rendezvous rendezvous ABSL_GUARDED_BY(mu);
  // A member announcing a round past ours: we are behind it.
  std::string ahead_peer ABSL_GUARDED_BY(mu);
  pb::ShardRunStatus status ABSL_GUARDED_BY(mu);
  // What an evaluation on a gRPC thread needs of the run (ShardRun::EvaluateArtifact): set once
  // the worker and the data are prepared, cleared before the worker is stopped or replaced.
  struct EvalTarget {
    std::shared_ptr<worker::WorkerProcess> worker;
    std::string eval_file;
    std::string work_dir;
    uint32_t eval_batch_size = 0;
  };
  std::optional<EvalTarget> eval_target ABSL_GUARDED_BY(mu);

  void ShareEvalTarget(bool ready) {
    absl::MutexLock lock(&mu);
    if (!ready) {
      eval_target.reset();
      return;
    }
    eval_target = EvalTarget{.worker = worker,
                             .eval_file = data.eval_file(),
                             .work_dir = work_dir,
                             .eval_batch_size = spec.spec.eval_batch_size()};
  }

  // ---- status

  void Transition(const std::string& what) {
    common::Log(common::LogLevel::kInfo, kComponent, what, {{"shard", absl::StrCat(shard_id)}});
    absl::MutexLock lock(&mu);
    status.add_transitions(
        absl::StrCat(absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone()), " ", what));
    if (static_cast<size_t>(status.transitions_size()) > kTransitionsKept) {
      status.mutable_transitions()->DeleteSubrange(0, 1);
    }
  }
  void SetState(const std::string& state) {
    absl::MutexLock lock(&mu);
    status.set_state(state);
  }
  void Fail(const absl::Status& error) {
    common::Log(common::LogLevel::kError, kComponent, "run failed",
                {{"shard", absl::StrCat(shard_id)}, {"error", std::string(error.message())}});
    absl::MutexLock lock(&mu);
    status.set_state("failed");
    status.set_error(std::string(error.message()));
  }
  bool Sleep(int64_t ms) {
    int64_t until = host.clock->MonotonicMs() + ms;
    while (!stopping && host.clock->MonotonicMs() < until) {
      host.clock->SleepMs(std::min<int64_t>(50, until - host.clock->MonotonicMs()));
    }
    return !stopping;
  }

  // ---- peers

  pb::ShardRound::Stub* StubFor(const std::string& endpoint) {
    auto it = stubs.find(endpoint);
    if (it != stubs.end()) return it->second.get();
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(16 << 20);
    // A member that died and came back must be reachable again within a poll or two: gRPC's
    // default reconnect backoff grows to minutes while it is down, and a channel in backoff fails
    // every call at once, so a restarted planner would be skipped round after round.
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kReconnectBackoffMinMs);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kReconnectBackoffMinMs);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kReconnectBackoffMaxMs);
    auto channel = grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(), args);
    auto stub = pb::ShardRound::NewStub(channel);
    auto* raw = stub.get();
    stubs.emplace(endpoint, std::move(stub));
    return raw;
  }

  template <typename Request>
  absl::Status Sign(Request* request, std::string_view method, const std::string& audience) {
    request->clear_auth();
    TS_ASSIGN_OR_RETURN(
        pb::PeerRequestAuth auth,
        SignPeerRequest(*host.key, host.chain_id, shard_id, method, audience, *request,
                        host.clock->NowUnixMs(), kDefaultPeerRequestLifetimeMs));
    *request->mutable_auth() = std::move(auth);
    return absl::OkStatus();
  }

  absl::StatusOr<ShardView> View() { return host.directory->Get(shard_id); }

  // ---- files

  std::string Path(const std::string& name) const { return work_dir + "/" + name; }
  void RemoveTree(const std::string& name) {
    std::error_code ec;
    std::filesystem::remove_all(Path(name), ec);
  }
  absl::Status MakeDir(const std::string& name) {
    std::error_code ec;
    std::filesystem::create_directories(Path(name), ec);
    if (ec) return absl::InternalError(absl::StrCat(Path(name), ": ", ec.message()));
    return absl::OkStatus();
  }

  // ---- certificates

  absl::StatusOr<std::vector<pb::RoundCertificate>> LoadCertificates(uint64_t from,
                                                                     uint32_t max) const {
    return LoadStoredCertificates(*host.db, shard_id, from, max);
  }

  void RecordRound(const pb::RoundCertificate& c, double round_seconds) {
    RecordRound(c, round_seconds, round_inner_seconds);
  }
  void RecordRound(const pb::RoundCertificate& c, double round_seconds, double inner_seconds,
                   double exchange_seconds = 0, double certify_seconds = 0) {
    absl::MutexLock lock(&mu);
    pb::RoundSummary* s = status.add_rounds();
    s->set_round(c.result().round());
    s->set_attempt(c.attempt());
    for (const auto& m : c.result().members()) s->add_members(m);
    s->set_new_root(c.result().new_root());
    s->set_train_loss(c.train_loss());
    s->set_eval_loss_micro(c.eval_loss_micro());
    s->set_bytes_exchanged(c.bytes_exchanged());
    s->set_signed_weight(c.signed_weight());
    s->set_inner_seconds(inner_seconds);
    s->set_round_seconds(round_seconds);
    s->set_exchange_seconds(exchange_seconds);
    s->set_certify_seconds(certify_seconds);
    if (static_cast<size_t>(status.rounds_size()) > kRoundsKept) {
      status.mutable_rounds()->DeleteSubrange(0, 1);
    }
    status.set_bytes_exchanged(status.bytes_exchanged() + c.bytes_exchanged());
  }

  // Stores certificates (already verified, consecutive from certified_round + 1) in one batch.
  absl::Status StoreCertificates(const std::vector<pb::RoundCertificate>& certs) {
    if (certs.empty()) return absl::OkStatus();
    state::WriteBatch batch;
    for (const auto& c : certs) {
      batch.PutProto(kTableRounds, RoundKey(shard_id, c.result().round()), c);
    }
    TS_RETURN_IF_ERROR(host.db->Write(batch));
    absl::MutexLock lock(&mu);
    certified_round = certs.back().result().round();
    certified_root = certs.back().result().new_root();
    certified_base_root = certs.back().result().base_root();
    status.set_certified_round(certified_round);
    status.set_root(certified_root);
    checkpoint_artifact.clear();
    return absl::OkStatus();
  }

  // ---- preparation

  absl::Status Prepare() {
    dir = absl::StrCat(options.work_root, "/", shard_id);
    work_dir = dir + "/work";
    std::error_code ec;
    std::filesystem::create_directories(work_dir, ec);
    if (ec) return absl::InternalError(absl::StrCat(work_dir, ": ", ec.message()));
    std::string socket = dir + "/worker.sock";
    if (socket.size() > 100)
      socket = absl::StrCat("/tmp/ts-worker-", ::getpid(), "-", shard_id, ".sock");
    worker::WorkerProcessOptions wo;
    wo.binary = options.worker_binary;
    wo.socket_path = socket;
    wo.work_dir = work_dir;
    wo.threads = options.worker_threads;
    wo.extra_args = {"--device", options.worker_device};
    if (options.worker_memory_bytes_max != 0) {
      wo.extra_args.push_back("--memory-bytes-max");
      wo.extra_args.push_back(absl::StrCat(options.worker_memory_bytes_max));
    }
    wo.log_file = dir + "/worker.log";
    TS_ASSIGN_OR_RETURN(worker, worker::WorkerProcess::Start(wo));
    worker_pid = worker->pid();
    // Where it trains, as the worker itself says (--device auto resolves there).
    TS_ASSIGN_OR_RETURN(pb::WorkerStatusResponse about, worker->client().Status());
    const std::string device = about.device() == "cuda"
                                   ? absl::StrCat("cuda (", about.device_name(), ")")
                                   : about.device();
    {
      absl::MutexLock lock(&mu);
      status.set_worker_device(device);
    }
    Transition(absl::StrCat("worker started (pid ", worker->pid(), ", ", options.worker_threads,
                            " threads, ", device, ")"));
    TS_RETURN_IF_ERROR(PrepareData());
    ShareEvalTarget(true);
    if (transport == nullptr) {
      TcpTransportOptions to;
      to.listen_address = options.collective_host + ":0";
      to.chain_id = host.chain_id;
      to.heartbeat_interval_ms = options.heartbeat_interval_ms;
      TS_ASSIGN_OR_RETURN(transport, TcpTransport::Start(*host.key, to, host.clock));
      absl::MutexLock lock(&mu);
      stop_transport = transport.get();
      if (stopping) transport->StopConnecting(Stopping());
    }
    return InitAndRestore();
  }

  // Builds the run's data through the worker (deterministic: the same bytes on every host)
  // and checks it against the spec's pinned root; for a packed dataset, finds it among the
  // members' dataset artifacts instead (PreparePacked).
  absl::Status PrepareData() {
    const pb::DataSpec& d = spec.spec.data();
    if (d.corpus() == "packed") return PreparePacked();
    pb::PrepareDataRequest prep;
    prep.set_corpus(d.corpus());
    prep.set_files(d.files());
    prep.set_vocab(d.vocab());
    prep.set_shard_tokens(d.shard_tokens());
    prep.set_eval_every(d.eval_every());
    prep.set_out_dir("data");
    TS_ASSIGN_OR_RETURN(data, worker->client().PrepareData(prep));
    std::string ids;
    for (const auto& id : data.shard_ids()) ids += id;
    ids += data.eval_id();
    const std::string dataset_root = common::Sha256(ids);
    if (!d.dataset_root().empty() && d.dataset_root() != dataset_root) {
      return absl::FailedPreconditionError(
          absl::StrCat("data: the prepared data set has root ", common::HexEncode(dataset_root),
                       ", the run spec pins ", common::HexEncode(d.dataset_root())));
    }
    Transition(absl::StrCat("data prepared: ", data.shard_files_size(), " training shards, ",
                            data.train_tokens(), " + ", data.eval_tokens(),
                            " held-out tokens, root ", Hex8(dataset_root),
                            data.reused() ? " (the files on disk, re-verified)" : ""));
    if (!data_published) PublishData();
    return absl::OkStatus();
  }

  // A packed dataset (docs/training.md "Data"): the run's data is the dataset artifact whose
  // files give the spec's root. This host's store is looked in first (its operator may have
  // published it), then the other members' (ArtifactOperator.Find); each candidate is fetched
  // from the members that hold it, exported, and checked — every file's hash and the root —
  // before it is used. Tried again every few seconds until one is found or the run stops.
  absl::Status PreparePacked() {
    const std::string want = spec.spec.data().dataset_root();
    const std::string data_dir = Path("data");
    std::set<std::string> tried;
    int64_t last_report_ms = 0;
    while (!stopping) {
      // A dataset exported before (a restart) is checked again like any other.
      if (std::filesystem::exists(data_dir + "/" + worker::kDatasetManifestFile)) {
        auto here = worker::ReadPackedDataset(data_dir);
        if (here.ok() && here->root == want) return UsePacked(*here);
        std::error_code ec;
        std::filesystem::remove_all(data_dir, ec);
      }
      std::vector<std::pair<std::string, std::vector<std::string>>> candidates;  // id, holders
      if (auto local = host.artifacts->List(shard_id); local.ok()) {
        for (const auto& a : *local) {
          if (a.kind() == "dataset") candidates.push_back({a.artifact_id(), {}});
        }
      }
      std::string unanswered;
      if (auto found = host.artifacts->Find(shard_id, "dataset"); found.ok()) {
        for (const auto& f : found->artifacts()) {
          candidates.push_back(
              {f.summary().artifact_id(), {f.holders().begin(), f.holders().end()}});
        }
        unanswered = absl::StrJoin(found->unanswered(), "; ");
      } else {
        unanswered = std::string(found.status().message());
      }
      for (const auto& [id, holders] : candidates) {
        if (stopping) break;
        if (!tried.insert(id).second) continue;
        if (!holders.empty()) {
          auto fetched =
              host.artifacts->Fetch(shard_id, id, holders, [this] { return !!stopping; });
          if (!fetched.ok()) {
            tried.erase(id);  // a fetch may fail for now and work later
            Transition(
                absl::StrCat("dataset ", Hex8(id), " not fetched: ", fetched.status().message()));
            continue;
          }
        }
        const std::string candidate_dir = Path(absl::StrCat("data-", Hex8(id)));
        std::error_code ec;
        std::filesystem::remove_all(candidate_dir, ec);
        if (absl::Status exported = host.artifacts->Export(shard_id, id, candidate_dir);
            !exported.ok()) {
          Transition(absl::StrCat("dataset ", Hex8(id), " not exported: ", exported.message()));
          continue;
        }
        auto dataset = worker::ReadPackedDataset(candidate_dir);
        if (!dataset.ok() || dataset->root != want) {
          Transition(absl::StrCat("dataset artifact ", Hex8(id), " is not the run's: ",
                                  dataset.ok() ? absl::StrCat("root ", Hex8(dataset->root))
                                               : dataset.status().message()));
          std::filesystem::remove_all(candidate_dir, ec);
          continue;
        }
        std::filesystem::rename(candidate_dir, data_dir, ec);
        if (ec) return absl::InternalError(absl::StrCat(data_dir, ": ", ec.message()));
        auto moved = worker::ReadPackedDataset(data_dir);
        if (!moved.ok()) return moved.status();
        Transition(absl::StrCat("dataset ", Hex8(want), " fetched as artifact ", Hex8(id)));
        data_published = true;  // it is an artifact of the shard already
        return UsePacked(*moved);
      }
      const int64_t now = host.clock->MonotonicMs();
      if (now - last_report_ms > 30'000) {
        Transition(absl::StrCat("waiting for the dataset ", Hex8(want),
                                " to be published by a member",
                                unanswered.empty() ? "" : absl::StrCat(" (", unanswered, ")")));
        last_report_ms = now;
      }
      Sleep(2000);
    }
    return Stopping();
  }

  // The run's data files from a checked packed dataset in <work>/data.
  absl::Status UsePacked(const worker::PackedDataset& dataset) {
    if (dataset.vocab != spec.spec.data().vocab()) {
      return absl::FailedPreconditionError(
          absl::StrCat("data: the packed dataset's tokenizer has ", dataset.vocab,
                       " pieces, the run spec's data.vocab is ", spec.spec.data().vocab()));
    }
    data.Clear();
    data.set_tokenizer_file(absl::StrCat("data/", worker::kDatasetTokenizerFile));
    uint64_t train_tokens = 0;
    for (const worker::PackedShard& s : dataset.train) {
      data.add_shard_files(absl::StrCat("data/", s.file));
      data.add_shard_ids(s.id);
      train_tokens += s.tokens;
    }
    data.set_eval_file(absl::StrCat("data/", dataset.eval.file));
    data.set_eval_id(dataset.eval.id);
    data.set_train_tokens(train_tokens);
    data.set_eval_tokens(dataset.eval.tokens);
    data.set_documents(dataset.documents);
    Transition(absl::StrCat("data: packed dataset ", Hex8(dataset.root), ", ", dataset.train.size(),
                            " training shards, ", train_tokens, " + ", dataset.eval.tokens,
                            " held-out tokens"));
    return absl::OkStatus();
  }

  // Makes the round-0 checkpoint, evaluates it, and loads the last certified checkpoint when
  // the records hold certificates.
  absl::Status InitAndRestore() {
    TS_ASSIGN_OR_RETURN(std::vector<pb::RoundCertificate> certs,
                        LoadCertificates(1, std::numeric_limits<uint32_t>::max()));
    TS_RETURN_IF_ERROR(MakeDir(CheckpointDir(0)));
    pb::InitModelRequest init;
    *init.mutable_spec() = spec.spec.model();
    init.set_checkpoint_file(CheckpointName(0));
    TS_ASSIGN_OR_RETURN(pb::InitModelResponse made, worker->client().InitModel(init));
    parameters = made.parameters();
    {
      absl::MutexLock lock(&mu);
      status.set_parameters(made.parameters());
      status.set_checkpoint_bytes(made.checkpoint_bytes());
      if (certs.empty()) {
        certified_round = 0;
        certified_root = made.root();
        certified_base_root = made.root();
        status.set_root(made.root());
      }
    }
    loaded = true;
    {
      pb::EvaluateRequest er;
      er.set_checkpoint_file(CheckpointName(0));
      er.set_eval_file(data.eval_file());
      er.set_batch_size(spec.spec.eval_batch_size());
      er.set_windows_max(spec.spec.eval_windows_max());
      TS_ASSIGN_OR_RETURN(pb::EvaluateResponse ev, worker->client().Evaluate(er));
      absl::MutexLock lock(&mu);
      status.set_initial_eval_loss_micro(static_cast<int64_t>(std::llround(ev.mean_loss() * 1e6)));
    }
    if (certs.empty()) {
      Transition(absl::StrCat("round-0 checkpoint ", Hex8(made.root()), " (", made.parameters(),
                              " parameters)"));
      return absl::OkStatus();
    }
    const pb::RoundCertificate& last = certs.back();
    {
      absl::MutexLock lock(&mu);
      certified_round = last.result().round();
      certified_root = last.result().new_root();
      certified_base_root = last.result().base_root();
      status.set_certified_round(certified_round);
      status.set_root(certified_root);
    }
    bool recorded;
    {
      absl::MutexLock lock(&mu);
      recorded = status.rounds_size() > 0;
    }
    if (!recorded) {
      for (const auto& c : certs) RecordRound(c, 0);
    }
    pb::LoadCheckpointRequest load;
    load.set_checkpoint_file(CheckpointName(last.result().round()));
    load.set_expected_root(last.result().new_root());
    auto restored = worker->client().LoadCheckpoint(load);
    loaded = restored.ok();
    Transition(absl::StrCat(
        "restarted at certified round ", last.result().round(), ": ",
        loaded ? "checkpoint found locally" : "checkpoint to be fetched from the members"));
    return absl::OkStatus();
  }

  void PublishData() {
    auto published = host.artifacts->Publish(shard_id, Path("data"), "dataset", 0);
    data_published = published.ok();
    if (published.ok()) {
      Transition(absl::StrCat("data set published as artifact ", Hex8(*published)));
    } else {
      Transition(absl::StrCat("data set not published: ", published.status().message()));
    }
  }

  // ---- rounds

  struct PlanOutcome {
    std::optional<pb::RoundPlan> plan;
    std::string behind_peer;  // set: catch up from this member
  };

  absl::StatusOr<PlanOutcome> PlanAsPlanner(uint64_t round, uint32_t min_attempt,
                                            const ShardView& view) {
    const int64_t start = host.clock->MonotonicMs();
    int64_t last_probe = start;
    size_t probe = 0;
    const int64_t preparing_wait_ms =
        spec.spec.join_window_ms() + static_cast<int64_t>(round_inner_seconds * 1000.0);
    const Rendezvous::Timing timing{.join_window_ms = spec.spec.join_window_ms(),
                                    .preparing_wait_ms = preparing_wait_ms,
                                    .fresh_ms = kAnnounceFreshMs};
    {
      absl::MutexLock lock(&mu);
      rendezvous.Enter(round, min_attempt);
      status.set_planner(host.address);
      status.set_planner_round(round);
    }
    while (!stopping) {
      {
        absl::MutexLock lock(&mu);
        if (!ahead_peer.empty())
          return PlanOutcome{.plan = std::nullopt, .behind_peer = std::exchange(ahead_peer, "")};
        if (const pb::RoundPlan* made = rendezvous.PlanFor(min_attempt); made != nullptr)
          return PlanOutcome{.plan = *made, .behind_peer = {}};
        const int64_t now = host.clock->MonotonicMs();
        rendezvous.Announce(host.address, {.endpoint = transport->endpoint(),
                                           .min_attempt = rendezvous.attempt(),
                                           .at_ms = now,
                                           .preparing = false});
        const Rendezvous::Decision decision = rendezvous.Decide(view, now, start, timing);
        if (decision.plan) {
          pb::RoundPlan p;
          p.set_shard_id(shard_id);
          p.set_round(round);
          p.set_attempt(rendezvous.attempt());
          p.set_planner(host.address);
          for (const auto& [address, endpoint] : decision.ready) {
            pb::RoundMember* m = p.add_members();
            m->set_address(address);
            m->set_collective_endpoint(endpoint);
          }
          p.set_base_root(certified_root);
          TS_ASSIGN_OR_RETURN(std::string data_root, DataRoot(round));
          p.set_data_seed(DataSeedOf(spec.spec.seed(), round, data_root));
          TS_RETURN_IF_ERROR(SignPlan(*host.key, host.chain_id, &p));
          rendezvous.set_plan(p);
          return PlanOutcome{.plan = p, .behind_peer = {}};
        }
      }
      // No plan long past the window: the others may have certified this round without this
      // host (it failed its attempt while they completed theirs) and be waiting on the next
      // round's planner, so nobody announces this round here again. Ask one member a second,
      // in turn, for certificates past this host's.
      const int64_t now = host.clock->MonotonicMs();
      if (now - start > PlanningBoundMs() && now - last_probe >= kStuckProbeMs &&
          view.members.size() > 1) {
        last_probe = now;
        if (view.members[probe % view.members.size()].address == host.address) ++probe;
        const std::string& peer = view.members[probe++ % view.members.size()].address;
        if (CatchUp(peer).ok()) {
          bool past;
          {
            absl::MutexLock lock(&mu);
            past = certified_round >= round;
          }
          if (past) {
            Transition(absl::StrCat(
                "round ", round, " was certified without this host; caught up from ", Short(peer)));
            return PlanOutcome{.plan = std::nullopt, .behind_peer = peer};
          }
        }
      }
      Sleep(50);
    }
    return absl::CancelledError("stopping");
  }

  // The root the data seed of `round` is drawn from: the round's base (the root certified at
  // round - 1) or, with overlap, the root certified at round - 2 (round 0's for rounds 1 and 2),
  // since then a round's inner steps start before the round before it is certified.
  absl::StatusOr<std::string> DataRoot(uint64_t round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const uint64_t lag = spec.spec.overlap() ? 2 : 1;
    const uint64_t from = round > lag ? round - lag : 0;
    if (certified_round == from) return certified_root;
    if (certified_round == from + 1) return certified_base_root;
    return absl::FailedPreconditionError(absl::StrCat("round ", round,
                                                      ": its data seed needs the root of round ",
                                                      from, ", certified is ", certified_round));
  }

  // Whether this host holds its Δ of `round`.
  bool HasDelta(uint64_t round) const {
    return spec.spec.overlap() ? deltas.contains(round) : delta_round == round;
  }

  // How long the members of a round take, at most, to announce to a planner that answers and
  // to learn its plan: the join window plus the planner timeout.
  int64_t PlanningBoundMs() const {
    return spec.spec.join_window_ms() + spec.spec.planner_timeout_ms();
  }

  // A signed Announce for `round` to `candidate`.
  absl::StatusOr<pb::AnnounceRequest> AnnounceTo(const std::string& candidate, uint64_t round,
                                                 uint32_t min_attempt, bool preparing) {
    pb::AnnounceRequest request;
    request.set_shard_id(shard_id);
    request.set_round(round);
    request.set_min_attempt(min_attempt);
    request.set_collective_endpoint(transport->endpoint());
    request.set_preparing(preparing);
    TS_RETURN_IF_ERROR(Sign(&request, kAnnounceMethod, candidate));
    return request;
  }

  // Sends a preparing announce for `round` to the first two planners in order (not this host),
  // on a thread of its own, best effort: a planner that hears it waits a bounded time for this
  // host's ready announce. The returned thread is joined when it goes out of scope.
  std::jthread PreAnnounce(uint64_t round, uint32_t min_attempt) {
    auto view = View();
    if (!view.ok()) return {};
    std::vector<std::pair<std::string, pb::ShardRound::Stub*>> targets;
    for (const std::string& candidate : PlannerOrder(spec.spec.seed(), round, view->members)) {
      if (targets.size() == 2) break;
      if (candidate == host.address) continue;
      const ShardMember* member = view->Find(candidate);
      if (member != nullptr) targets.emplace_back(candidate, StubFor(member->endpoint));
    }
    std::vector<pb::AnnounceRequest> requests;
    for (const auto& [candidate, stub] : targets) {
      auto request = AnnounceTo(candidate, round, min_attempt, /*preparing=*/true);
      if (!request.ok()) return {};
      requests.push_back(std::move(*request));
    }
    return std::jthread([targets = std::move(targets), requests = std::move(requests)] {
      for (size_t i = 0; i < targets.size(); ++i) {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1000));
        pb::AnnounceResponse response;
        (void)targets[i].second->Announce(&context, requests[i], &response);
      }
    });
  }

  absl::StatusOr<PlanOutcome> ObtainPlan(uint64_t round, uint32_t min_attempt) {
    TS_ASSIGN_OR_RETURN(ShardView view, View());
    std::vector<std::string> order = PlannerOrder(spec.spec.seed(), round, view.members);
    size_t p = 0;
    int64_t failing_since = -1;
    std::string base;
    std::string data_root;
    {
      absl::MutexLock lock(&mu);
      base = certified_root;
      TS_ASSIGN_OR_RETURN(data_root, DataRoot(round));
      status.set_current_round(round);
      status.set_attempt(min_attempt);
    }
    const std::string seed = DataSeedOf(spec.spec.seed(), round, data_root);
    while (!stopping) {
      const std::string& candidate = order[p % order.size()];
      if (candidate == host.address) return PlanAsPlanner(round, min_attempt, view);
      {
        absl::MutexLock lock(&mu);
        status.set_planner(candidate);
        status.set_planner_round(round);
        if (!ahead_peer.empty())
          return PlanOutcome{.plan = std::nullopt, .behind_peer = std::exchange(ahead_peer, "")};
      }
      const ShardMember* member = view.Find(candidate);
      TS_ASSIGN_OR_RETURN(pb::AnnounceRequest request,
                          AnnounceTo(candidate, round, min_attempt, /*preparing=*/false));
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(kRpcTimeoutMs));
      pb::AnnounceResponse response;
      grpc::Status rpc = StubFor(member->endpoint)->Announce(&context, request, &response);
      if (rpc.ok()) {
        failing_since = -1;
        if (response.certified_round() >= round)
          return PlanOutcome{.plan = std::nullopt, .behind_peer = candidate};
        if (response.has_plan()) {
          const pb::RoundPlan& plan = response.plan();
          absl::Status valid = VerifyPlan(host.chain_id, plan, view);
          if (valid.ok() && (plan.round() != round || plan.planner() != candidate ||
                             plan.base_root() != base || plan.data_seed() != seed)) {
            valid = absl::InvalidArgumentError("the plan is for another round, planner or base");
          }
          if (!valid.ok()) {
            Transition(absl::StrCat("round ", round, ": plan from ", Short(candidate),
                                    " refused: ", valid.message()));
            ++p;
            continue;
          }
          if (plan.attempt() >= min_attempt) return PlanOutcome{.plan = plan, .behind_peer = {}};
        } else if (response.attempt() > min_attempt && HasDelta(round)) {
          // A planner already past the attempts this host knows of: join its attempt.
          min_attempt = response.attempt();
        }
        Sleep(100);
        continue;
      }
      if (failing_since < 0) failing_since = host.clock->MonotonicMs();
      if (host.clock->MonotonicMs() - failing_since > spec.spec.planner_timeout_ms()) {
        Transition(absl::StrCat("round ", round, ": planner ", Short(candidate),
                                " does not answer (", rpc.error_message(),
                                "); next in order: ", Short(order[(p + 1) % order.size()])));
        ++p;
        failing_since = -1;
      }
      Sleep(200);
    }
    return absl::CancelledError("stopping");
  }

  // H inner steps of `round` from the certified checkpoint, or from it minus this host's Δ in
  // `rebase_on` (the round in flight, with overlap).
  absl::Status InnerSteps(uint64_t round, const std::string& rebase_on = {}) {
    std::string base;
    std::string data_root;
    {
      absl::MutexLock lock(&mu);
      base = certified_root;
      TS_ASSIGN_OR_RETURN(data_root, DataRoot(round));
      status.set_state("training");
      status.set_current_round(round);
    }
    pb::InnerStepsRequest request;
    for (const auto& f : data.shard_files()) request.add_shard_files(f);
    request.set_data_seed(DataSeedOf(spec.spec.seed(), round, data_root));
    request.set_round(round);
    request.set_host(host.address);
    request.set_steps(spec.spec.inner_steps());
    request.set_batch_size(spec.spec.batch_size());
    *request.mutable_adamw() = spec.spec.inner();
    request.set_delta_file(DeltaName(round));
    request.set_rebase_delta_file(rebase_on);
    request.set_base_root(base);
    // The schedule is keyed to the global inner step, so a host that rejoins at round r uses
    // the rate every other host uses there.
    *request.mutable_training() = spec.spec.training();
    request.set_first_step((round - 1) * uint64_t{spec.spec.inner_steps()});
    request.set_total_steps(uint64_t{spec.spec.rounds()} * spec.spec.inner_steps());
    if (spec.spec.overlap()) {
      deltas.erase(round);  // rewritten now, over round - 2's
      deltas.erase(round - 2);
    }
    TS_ASSIGN_OR_RETURN(pb::InnerStepsResponse done,
                        worker->client().InnerSteps(request, InnerStepsTimeoutMs(spec.spec)));
    delta_round = round;
    last_train_loss = done.losses().empty() ? 0 : done.losses(done.losses_size() - 1);
    round_inner_seconds = done.seconds();
    if (spec.spec.overlap()) deltas[round] = {last_train_loss, round_inner_seconds};
    absl::MutexLock lock(&mu);
    status.set_inner_seconds(status.inner_seconds() + done.seconds());
    return absl::OkStatus();
  }

  absl::Status ReloadBase() {
    uint64_t round;
    std::string root;
    {
      absl::MutexLock lock(&mu);
      round = certified_round;
      root = certified_root;
    }
    pb::LoadCheckpointRequest load;
    load.set_checkpoint_file(CheckpointName(round));
    load.set_expected_root(root);
    auto done = worker->client().LoadCheckpoint(load);
    loaded = done.ok();
    return done.status();
  }

  // What a mesh is aborted with when the run stops: this host at fault, so the others retry
  // without it.
  absl::Status Stopping() const {
    return PeerFailure(absl::StatusCode::kCancelled, host.address, "its run is stopping");
  }

  // Registers a mesh for Stop to abort while in scope (the mesh outlives the guard).
  class AbortOnStop {
   public:
    AbortOnStop(Impl* run, Mesh* mesh) : run_(run), mesh_(mesh) {
      absl::MutexLock lock(&run_->mu);
      run_->meshes.insert(mesh_);
      if (run_->stopping) mesh_->Abort(run_->Stopping());
    }
    ~AbortOnStop() {
      absl::MutexLock lock(&run_->mu);
      run_->meshes.erase(mesh_);
    }

   private:
    Impl* run_;
    Mesh* mesh_;
  };

  // The first half of a round's exchange: the mesh of the plan's members and the allreduce of
  // their Δ. Touches no state of the run thread's but the transport and the Δ file, so with
  // overlap it runs on a thread of its own while the worker computes the next round's steps.
  struct Reduced {
    pb::RoundPlan plan;
    ShardView view;
    GroupSpec group;
    size_t self = 0;
    int64_t started = 0;
    int64_t deadline = 0;
    std::unique_ptr<Mesh> mesh;
    std::unique_ptr<Collective> collective;
    std::vector<float> aggregate;
    uint64_t bytes = 0;
    int64_t reduced = 0;  // when the aggregate was complete
  };

  absl::StatusOr<Reduced> Reduce(const pb::RoundPlan& plan) {
    Reduced r;
    r.plan = plan;
    const uint64_t round = plan.round();
    r.started = host.clock->MonotonicMs();
    r.deadline = r.started + spec.spec.exchange_timeout_ms();
    const int64_t started = r.started;
    const int64_t deadline = r.deadline;
    TS_ASSIGN_OR_RETURN(r.view, View());
    GroupSpec& group = r.group;
    group.shard_id = shard_id;
    group.session = (round << 16) | plan.attempt();
    size_t self = plan.members_size();
    for (int i = 0; i < plan.members_size(); ++i) {
      group.members.push_back({plan.members(i).address(), plan.members(i).collective_endpoint()});
      if (plan.members(i).address() == host.address) self = i;
    }
    r.self = self;
    // Every member of a plan announced within the last seconds and polls for the plan, so all of
    // them dial within a poll or two; a member that died after the plan was made would otherwise
    // hold the others until the exchange deadline.
    const int64_t connect_deadline =
        std::min(deadline, started + std::max<int64_t>(kConnectMinMs, PlanningBoundMs()));
    TS_ASSIGN_OR_RETURN(r.mesh, transport->Connect(group, self, connect_deadline));
    r.collective = std::make_unique<Collective>(r.mesh.get(), host.key, host.chain_id, host.clock);
    Collective& collective = *r.collective;
    AbortOnStop guard(this, r.mesh.get());

    // Read straight into the buffer the collective reduces in place: one copy of the Δ here.
    std::vector<float>& delta = r.aggregate;
    delta.resize(parameters);
    TS_RETURN_IF_ERROR(worker::ReadWorkFileInto(
        work_dir, "delta_file", DeltaName(round),
        std::span<char>(reinterpret_cast<char*>(delta.data()), 4 * delta.size())));
    OpOptions op;
    op.op_id = 1;
    op.codec = spec.codec;
    op.reduce = ReduceOp::kMean;
    op.deadline_ms = deadline;
    if (spec.aggregate.kind == Aggregator::kMean) {
      TS_ASSIGN_OR_RETURN(OpStats stats, collective.AllReduce(op, delta));
      r.bytes += stats.wire_bytes_sent;
    } else {
      TS_ASSIGN_OR_RETURN(OpStats stats, collective.RobustAllReduce(op, spec.aggregate, delta));
      r.bytes += stats.wire_bytes_sent;
    }
    r.reduced = host.clock->MonotonicMs();
    return r;
  }

  // The exchange of one attempt of a round: allreduce, outer step, evaluation, signatures.
  absl::Status Exchange(const pb::RoundPlan& plan) {
    TS_ASSIGN_OR_RETURN(Reduced r, Reduce(plan));
    return Finish(r, last_train_loss, round_inner_seconds);
  }

  // The second half: the outer step with the aggregate, the members' signed results (and
  // evaluations) gathered over the same mesh, the certificate, the published checkpoint.
  // `own_train_loss` and `inner_seconds` are this host's of the round's inner steps.
  absl::Status Finish(Reduced& r, float own_train_loss, double inner_seconds) {
    const pb::RoundPlan& plan = r.plan;
    const uint64_t round = plan.round();
    const ShardView& view = r.view;
    const GroupSpec& group = r.group;
    const size_t self = r.self;
    const int64_t started = r.started;
    // With overlap the members come here after their next round's steps, which take a while
    // and not the same while on every host: the rest of the exchange gets its own timeout.
    const int64_t deadline =
        std::max(r.deadline, host.clock->MonotonicMs() + spec.spec.exchange_timeout_ms());
    Collective& collective = *r.collective;
    AbortOnStop guard(this, r.mesh.get());
    std::vector<float>& delta = r.aggregate;
    uint64_t bytes = r.bytes;
    OpOptions op;
    op.codec = spec.codec;
    op.reduce = ReduceOp::kMean;
    op.deadline_ms = deadline;
    TS_RETURN_IF_ERROR(worker::WriteWorkFile(
        work_dir, "aggregate", "aggregate.bin",
        std::string_view(reinterpret_cast<const char*>(delta.data()), 4 * delta.size())));
    TS_RETURN_IF_ERROR(MakeDir(CheckpointDir(round)));
    pb::OuterStepRequest outer;
    outer.set_delta_file("aggregate.bin");
    *outer.mutable_outer() = spec.spec.outer();
    outer.set_checkpoint_file(CheckpointName(round));
    outer.set_base_root(plan.base_root());
    TS_ASSIGN_OR_RETURN(pb::OuterStepResponse stepped, worker->client().OuterStep(outer));
    loaded = false;  // the worker now holds an uncertified checkpoint

    pb::RoundResult result;
    result.set_shard_id(shard_id);
    result.set_round(round);
    result.set_base_root(plan.base_root());
    result.set_new_root(stepped.root());
    for (const auto& m : plan.members()) result.add_members(m.address());
    result.set_run_spec_hash(spec.hash);
    pb::RoundCertificate vote;  // this member's block: its result, signature, evaluation
    *vote.mutable_result() = result;
    pb::MemberSignature* own = vote.add_signatures();
    own->set_host(host.address);
    TS_ASSIGN_OR_RETURN(std::string sig, SignRoundResult(*host.key, host.chain_id, result));
    own->set_signature(sig);
    vote.set_train_loss(own_train_loss);
    const bool evaluate = round % spec.spec.eval_every() == 0 || round == spec.spec.rounds();
    if (evaluate) {
      pb::EvaluateRequest er;
      er.set_eval_file(data.eval_file());
      er.set_batch_size(spec.spec.eval_batch_size());
      er.set_windows_max(spec.spec.eval_windows_max());
      TS_ASSIGN_OR_RETURN(pb::EvaluateResponse ev, worker->client().Evaluate(er));
      pb::SignedEvaluation* se = vote.add_evaluations();
      pb::EvaluationResult* e = se->mutable_result();
      e->set_shard_id(shard_id);
      e->set_round(round);
      e->set_checkpoint_root(stepped.root());
      e->set_eval_set_id(ev.eval_id());
      e->set_loss_micro(static_cast<int64_t>(std::llround(ev.mean_loss() * 1e6)));
      e->set_tokens(ev.tokens());
      e->set_host(host.address);
      TS_ASSIGN_OR_RETURN(std::string esig, SignEvaluation(*host.key, host.chain_id, *e));
      se->set_signature(esig);
    }
    TS_ASSIGN_OR_RETURN(std::string block, PackBlock(vote, kVoteBlockBytes));
    std::string gathered(kVoteBlockBytes * group.members.size(), '\0');
    op.op_id = 2;
    TS_ASSIGN_OR_RETURN(OpStats gstats, collective.AllGather(op, block, gathered));
    bytes += gstats.wire_bytes_sent;

    pb::RoundCertificate cert;
    *cert.mutable_result() = result;
    cert.set_attempt(plan.attempt());
    const std::string result_bytes = DeterministicBytes(result);
    std::vector<int64_t> losses;
    double train_loss = 0;
    int train_n = 0;
    for (size_t i = 0; i < group.members.size(); ++i) {
      pb::RoundCertificate theirs;
      const std::string& who = group.members[i].address;
      if (!UnpackBlock(std::string_view(gathered).substr(i * kVoteBlockBytes, kVoteBlockBytes),
                       &theirs) ||
          theirs.signatures_size() != 1 || theirs.signatures(0).host() != who) {
        Transition(absl::StrCat("round ", round, ": ", Short(who), " sent a malformed vote"));
        continue;
      }
      if (DeterministicBytes(theirs.result()) != result_bytes) {
        Transition(absl::StrCat("round ", round, ": ", Short(who), " reports root ",
                                Hex8(theirs.result().new_root()), ", this host ",
                                Hex8(result.new_root())));
        continue;
      }
      auto signer = common::RecoverStatementSigner(kRoundSignKind, host.chain_id, shard_id,
                                                   result_bytes, theirs.signatures(0).signature());
      if (!signer.ok() || *signer != who) {
        Transition(absl::StrCat("round ", round, ": ", Short(who), "'s signature does not verify"));
        continue;
      }
      *cert.add_signatures() = theirs.signatures(0);
      cert.set_signed_weight(cert.signed_weight() + view.Find(who)->weight);
      train_loss += theirs.train_loss();
      ++train_n;
      if (evaluate && theirs.evaluations_size() == 1) {
        const pb::SignedEvaluation& e = theirs.evaluations(0);
        auto esigner =
            common::RecoverStatementSigner(kEvaluationSignKind, host.chain_id, shard_id,
                                           DeterministicBytes(e.result()), e.signature());
        if (esigner.ok() && *esigner == who && e.result().host() == who &&
            e.result().checkpoint_root() == result.new_root() && e.result().round() == round) {
          *cert.add_evaluations() = e;
          losses.push_back(e.result().loss_micro());
        }
      }
    }
    cert.set_total_weight(TotalWeight(view));
    cert.set_eval_loss_micro(MedianOf(losses));
    cert.set_train_loss(train_n > 0 ? static_cast<float>(train_loss / train_n) : 0);
    cert.set_bytes_exchanged(bytes);
    if (!HasQuorum(cert.signed_weight(), cert.total_weight())) {
      return absl::FailedPreconditionError(
          absl::StrCat("round ", round, ": signatures of weight ", cert.signed_weight(), " of ",
                       cert.total_weight(), " agree, not more than 2/3"));
    }
    TS_RETURN_IF_ERROR(VerifyCertificate(host.chain_id, cert, view));
    TS_RETURN_IF_ERROR(StoreCertificates({cert}));
    loaded = true;
    const int64_t certified = host.clock->MonotonicMs();
    RecordRound(cert, (certified - started) / 1000.0 + inner_seconds, inner_seconds,
                (r.reduced - started) / 1000.0, (certified - r.reduced) / 1000.0);
    std::vector<std::string> short_members;
    for (const auto& m : result.members()) short_members.push_back(Short(m));
    Transition(absl::StrCat("round ", round, " certified (attempt ", plan.attempt(), ", ",
                            cert.signatures_size(), " signatures, weight ", cert.signed_weight(),
                            "/", cert.total_weight(), "): root ", Hex8(result.new_root()),
                            ", train loss ", cert.train_loss(),
                            evaluate ? absl::StrCat(", eval loss ", cert.eval_loss_micro() / 1e6,
                                                    " (median of ", losses.size(), ")")
                                     : std::string(),
                            "; members ", absl::StrJoin(short_members, ", ")));

    PublishCheckpoint(round, &collective, group, self, deadline);
    {
      const double publish_seconds = (host.clock->MonotonicMs() - certified) / 1000.0;
      absl::MutexLock lock(&mu);
      for (pb::RoundSummary& s : *status.mutable_rounds()) {
        if (s.round() == round) s.set_publish_seconds(publish_seconds);
      }
    }
    if (round == spec.spec.rounds()) ExchangeSettlement(&collective, group, deadline);
    // Files of rounds no longer needed.
    if (round >= 2) RemoveTree(CheckpointDir(round - 2));
    return absl::OkStatus();
  }

  // Publishes the certified checkpoint, then the members adopt the first member's artifact (all
  // its chunks are already here), so a joining host can fetch one artifact from every member.
  void PublishCheckpoint(uint64_t round, Collective* collective, const GroupSpec& group,
                         size_t self, int64_t deadline) {
    // The run's tokenizer travels in every checkpoint artifact, so whoever fetches one — a
    // joining member, the shard's creator or a reader — can turn text into tokens and back.
    if (!data.tokenizer_file().empty()) {
      std::error_code ec;
      std::filesystem::copy_file(Path(data.tokenizer_file()),
                                 Path(absl::StrCat(CheckpointDir(round), "/", kTokenizerFile)),
                                 std::filesystem::copy_options::overwrite_existing, ec);
      if (ec) {
        Transition(absl::StrCat("round ", round,
                                ": tokenizer not added to the checkpoint: ", ec.message()));
      }
    }
    auto published =
        host.artifacts->Publish(shard_id, Path(CheckpointDir(round)), "checkpoint", round);
    if (!published.ok()) {
      Transition(absl::StrCat("round ", round,
                              ": checkpoint not published: ", published.status().message()));
      return;
    }
    std::string mine = *published;
    std::string gathered(32 * group.members.size(), '\0');
    OpOptions op;
    op.op_id = 3;
    op.deadline_ms = deadline;
    std::string adopted = mine;
    if (collective->AllGather(op, mine, gathered).ok() && self != 0) {
      std::string first = gathered.substr(0, 32);
      if (host.artifacts
              ->Fetch(shard_id, first, {group.members[0].address},
                      [this] { return stopping.load(); })
              .ok()) {
        adopted = first;
        (void)host.artifacts->Drop(shard_id, {mine});
      }
    }
    {
      absl::MutexLock lock(&mu);
      if (certified_round == round) checkpoint_artifact = adopted;
      status.set_final_checkpoint_artifact_id(adopted);
    }
    DropOldCheckpoints(adopted);
  }

  void DropOldCheckpoints(const std::string& keep) {
    auto list = host.artifacts->List(shard_id);
    if (!list.ok()) return;
    std::vector<std::string> drop;
    for (const auto& a : *list) {
      if (a.kind() == "checkpoint" && a.artifact_id() != keep) drop.push_back(a.artifact_id());
    }
    if (!drop.empty()) (void)host.artifacts->Drop(shard_id, drop);
  }

  absl::StatusOr<pb::Settlement> Draft() {
    return DraftFromRecords(host, shard_id, spec.spec.rounds());
  }

  void ExchangeSettlement(Collective* collective, const GroupSpec& group, int64_t deadline) {
    auto draft = Draft();
    if (!draft.ok()) {
      Transition(absl::StrCat("settlement not drafted: ", draft.status().message()));
      return;
    }
    settlement = *draft;
    auto signed_draft = host.sign_settlement(*draft);
    pb::SettlementSignature mine;
    if (signed_draft.ok())
      mine = *signed_draft;
    else
      Transition(absl::StrCat("settlement not signed: ", signed_draft.status().message()));
    auto block = PackBlock(mine, kSettlementBlockBytes);
    if (!block.ok()) return;
    std::string gathered(kSettlementBlockBytes * group.members.size(), '\0');
    OpOptions op;
    op.op_id = 4;
    op.deadline_ms = deadline;
    if (!collective->AllGather(op, *block, gathered).ok()) return;
    const std::string bytes = DeterministicBytes(*draft);
    settlement_signatures.clear();
    for (size_t i = 0; i < group.members.size(); ++i) {
      pb::SettlementSignature s;
      if (!UnpackBlock(
              std::string_view(gathered).substr(i * kSettlementBlockBytes, kSettlementBlockBytes),
              &s)) {
        continue;
      }
      auto signer = common::RecoverStatementSigner(protocol::kSignSettlement, host.chain_id,
                                                   shard_id, bytes, s.signature());
      if (signer.ok() && *signer == s.host() && s.host() == group.members[i].address) {
        settlement_signatures.push_back(s);
      }
    }
    Transition(absl::StrCat("settlement drafted: final root ", Hex8(draft->final_checkpoint_root()),
                            ", eval loss ", draft->evaluation().value_micro() / 1e6, ", ",
                            settlement_signatures.size(), " signatures gathered"));
    absl::MutexLock lock(&mu);
    *status.mutable_settlement() = *draft;
  }

  // Waits for the chain to settle the shard; the first member of the final round submits at
  // once, the others after a while if it has not landed.
  void Settle(bool first_member) {
    SetState("settling");
    const int64_t start = host.clock->MonotonicMs();
    bool submitted = false;
    while (!stopping) {
      auto shard = host.chain_shard(shard_id);
      if (shard.ok() && shard->status() == pb::SHARD_STATUS_SETTLED) {
        Transition("shard settled on chain");
        SetState("done");
        return;
      }
      if (shard.ok() && shard->status() != pb::SHARD_STATUS_RUNNING) {
        Transition(absl::StrCat("shard is ", pb::ShardStatus_Name(shard->status())));
        SetState("done");
        return;
      }
      const bool due = first_member || host.clock->MonotonicMs() - start > 15000;
      if (!submitted && due && !settlement_signatures.empty()) {
        auto tx = host.submit_settlement(settlement, settlement_signatures);
        submitted = true;
        if (tx.ok()) {
          Transition(absl::StrCat("settlement submitted, tx ", tx->substr(0, 16)));
          absl::MutexLock lock(&mu);
          status.set_settlement_txhash(*tx);
        } else {
          Transition(absl::StrCat("settlement submission refused: ", tx.status().message()));
        }
      }
      Sleep(500);
    }
  }

  // ---- catching up

  absl::Status CatchUp(const std::string& peer) {
    SetState("catching_up");
    TS_ASSIGN_OR_RETURN(ShardView view, View());
    const ShardMember* member = view.Find(peer);
    if (member == nullptr) return absl::NotFoundError(absl::StrCat(peer, " is not a member"));
    uint64_t have;
    std::string root;
    {
      absl::MutexLock lock(&mu);
      have = certified_round;
      root = certified_root;
    }
    pb::GetCertificatesResponse response;
    while (true) {
      pb::GetCertificatesRequest request;
      request.set_shard_id(shard_id);
      request.set_from_round(have + 1);
      request.set_max(kCertificatesPerCallMax);
      TS_RETURN_IF_ERROR(Sign(&request, kGetCertificatesMethod, peer));
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(kRpcTimeoutMs));
      response.Clear();
      grpc::Status rpc = StubFor(member->endpoint)->GetCertificates(&context, request, &response);
      if (!rpc.ok()) return FromGrpcStatus(rpc, absl::StrCat("GetCertificates ", peer));
      std::vector<pb::RoundCertificate> verified;
      for (const auto& c : response.certificates()) {
        if (c.result().round() != have + 1 || c.result().base_root() != root) {
          return absl::InvalidArgumentError(
              absl::StrCat(peer, ": certificate of round ", c.result().round(),
                           " does not continue round ", have, " (root ", Hex8(root), ")"));
        }
        TS_RETURN_IF_ERROR(VerifyCertificate(host.chain_id, c, view));
        verified.push_back(c);
        have = c.result().round();
        root = c.result().new_root();
      }
      TS_RETURN_IF_ERROR(StoreCertificates(verified));
      for (const auto& c : verified) RecordRound(c, 0);
      if (!verified.empty()) {
        Transition(absl::StrCat("caught up from ", Short(peer), " to round ", have, " (",
                                verified.size(), " certificates verified)"));
        loaded = false;
      }
      if (verified.size() < kCertificatesPerCallMax) break;
    }
    if (loaded) return absl::OkStatus();
    return FetchCheckpoint(response.checkpoint_artifact_id(), have, root, view);
  }

  absl::Status FetchCheckpoint(const std::string& artifact_id, uint64_t round,
                               const std::string& root, const ShardView& view) {
    if (artifact_id.size() != 32) {
      return absl::UnavailableError(
          absl::StrCat("no member named an artifact holding the checkpoint of round ", round));
    }
    std::vector<std::string> peers;
    for (const ShardMember& m : view.members) {
      if (m.address != host.address && !m.endpoint.empty()) peers.push_back(m.address);
    }
    const int64_t start = host.clock->MonotonicMs();
    TS_ASSIGN_OR_RETURN(
        pb::ArtifactProgress progress,
        host.artifacts->Fetch(shard_id, artifact_id, peers, [this] { return stopping.load(); }));
    RemoveTree(CheckpointDir(round));
    TS_RETURN_IF_ERROR(host.artifacts->Export(shard_id, artifact_id, Path(CheckpointDir(round))));
    pb::LoadCheckpointRequest load;
    load.set_checkpoint_file(CheckpointName(round));
    load.set_expected_root(root);
    TS_RETURN_IF_ERROR(worker->client().LoadCheckpoint(load).status());
    loaded = true;
    std::vector<std::string> sources;
    for (const auto& [peer, b] : progress.bytes_by_peer()) {
      sources.push_back(absl::StrCat(Short(peer), " ", b >> 10, " KiB"));
    }
    Transition(absl::StrCat("checkpoint of round ", round, " fetched in ",
                            (host.clock->MonotonicMs() - start) / 1000.0, " s (",
                            absl::StrJoin(sources, ", "), ") and loaded"));
    absl::MutexLock lock(&mu);
    if (certified_round == round) checkpoint_artifact = artifact_id;
    return absl::OkStatus();
  }

  // Asks every member for certificates past ours; catches up from the first that has some.
  void CatchUpFromAnyone() {
    auto view = View();
    if (!view.ok()) return;
    for (const ShardMember& m : view->members) {
      if (m.address == host.address || stopping) continue;
      if (CatchUp(m.address).ok() && loaded) return;
    }
  }

  // ---- the run

  void Loop() {
    start_ms = host.clock->MonotonicMs();
    SetState("preparing");
    if (absl::Status prepared = Prepare(); !prepared.ok()) {
      Fail(prepared);
      return;
    }
    CatchUpFromAnyone();
    if (spec.spec.overlap()) {
      LoopOverlapped();
      return;
    }
    uint32_t min_attempt = 0;
    uint64_t attempt_round = 0;
    bool first_member = false;
    while (!stopping) {
      uint64_t round;
      {
        absl::MutexLock lock(&mu);
        round = certified_round + 1;
        status.set_wall_seconds((host.clock->MonotonicMs() - start_ms) / 1000.0);
      }
      if (round > spec.spec.rounds()) {
        Settle(first_member);
        while (!stopping) Sleep(200);
        return;
      }
      if (!loaded) {
        CatchUpFromAnyone();
        if (!loaded) {
          Sleep(500);
          continue;
        }
      }
      if (attempt_round != round) {
        attempt_round = round;
        min_attempt = 0;
      }
      if (delta_round != round) {
        absl::Status s;
        {
          // The first planners in order hear that this host is on its way while it trains.
          std::jthread told = PreAnnounce(round, min_attempt);
          s = InnerSteps(round);
        }
        if (!s.ok()) {
          if (!InnerStepsFailed(round, s)) return;
          continue;
        }
      }
      std::optional<pb::RoundPlan> plan = PlanWithThisHost(round, min_attempt);
      if (!plan) continue;
      SetState("training");
      first_member = plan->members(0).address() == host.address;
      absl::Status exchanged = Exchange(*plan);
      if (exchanged.ok()) continue;
      min_attempt = plan->attempt() + 1;
      if (!AttemptFailed(*plan, exchanged)) return;
    }
  }

  // After inner steps that failed: a worker that died is started again, a data shard it
  // refused (missing, corrupt) is built again. False when the run must end.
  bool InnerStepsFailed(uint64_t round, const absl::Status& s) {
    if (!worker->Running()) return RestartWorker(s);
    Transition(absl::StrCat("round ", round, ": inner steps failed: ", s.message(),
                            "; preparing the data again"));
    if (absl::Status again = PrepareData(); !again.ok()) {
      Transition(absl::StrCat("preparing the data: ", again.message()));
    }
    Sleep(1000);
    return true;
  }

  // Drops this host's Δs when the certified round moved while it was in scope (by catching up:
  // they were computed from a start the others are past).
  class CertifiedMoves {
   public:
    explicit CertifiedMoves(Impl* run) : run_(run), before_(run->CertifiedRound()) {}
    ~CertifiedMoves() {
      if (run_->CertifiedRound() != before_) run_->deltas.clear();
    }

   private:
    Impl* run_;
    uint64_t before_;
  };
  uint64_t CertifiedRound() {
    absl::MutexLock lock(&mu);
    return certified_round;
  }

  // The plan of `round` when this host is in it. Otherwise (no plan yet, this host behind or
  // left out) nullopt after catching up or waiting a little; the caller goes round again.
  std::optional<pb::RoundPlan> PlanWithThisHost(uint64_t round, uint32_t min_attempt) {
    auto outcome = ObtainPlan(round, min_attempt);
    if (!outcome.ok()) {
      if (!stopping) Transition(absl::StrCat("round ", round, ": ", outcome.status().message()));
      Sleep(500);
      return std::nullopt;
    }
    if (!outcome->behind_peer.empty()) {
      CertifiedMoves moves(this);
      if (absl::Status s = CatchUp(outcome->behind_peer); !s.ok()) {
        Transition(
            absl::StrCat("catching up from ", Short(outcome->behind_peer), ": ", s.message()));
        Sleep(500);
      }
      return std::nullopt;
    }
    const pb::RoundPlan& plan = *outcome->plan;
    bool in_plan = false;
    for (const auto& m : plan.members()) in_plan |= m.address() == host.address;
    if (in_plan) return plan;
    Transition(absl::StrCat("round ", round, " attempt ", plan.attempt(),
                            " planned without this host; waiting for its certificate"));
    // Polls the planner for the round's certificate, so that the next round finds this host
    // ready in time; back to ObtainPlan after a second in case the attempt fails.
    CertifiedMoves moves(this);
    for (int i = 0; i < 5 && !stopping; ++i) {
      Sleep(200);
      CatchUp(plan.planner()).IgnoreError();
      absl::MutexLock lock(&mu);
      if (certified_round >= round) break;
    }
    return std::nullopt;
  }

  // After an attempt of `plan` that failed: back to the certified checkpoint, the worker
  // started again if it died. False when the run must end.
  bool AttemptFailed(const pb::RoundPlan& plan, const absl::Status& exchanged) {
    std::string who = FailedPeerOf(exchanged);
    Transition(absl::StrCat("round ", plan.round(), " attempt ", plan.attempt(), " failed",
                            who.empty() ? "" : absl::StrCat(" (", Short(who), ")"), ": ",
                            exchanged.message(), "; retrying with the members that answer"));
    if (!loaded) {
      if (absl::Status reloaded = ReloadBase(); !reloaded.ok()) {
        Transition(absl::StrCat("reloading the certified checkpoint: ", reloaded.message()));
      }
    }
    return worker->Running() || RestartWorker(exchanged);
  }

  // ---- the run with overlap (docs/training.md "Overlap")

  // This host's Δ of a round in flight: its plan, its allreduce running on a thread of its own,
  // and what the inner steps reported.
  struct InFlight {
    pb::RoundPlan plan;
    DeltaInfo info;
    std::future<absl::StatusOr<Reduced>> reduced;
  };

  // Round r's allreduce runs while the worker computes round r + 1's inner steps from the
  // certified checkpoint minus this host's Δ of round r; then round r's outer step, signatures
  // and certificate, round r + 1's plan and its allreduce in the background, and so on. A
  // failed attempt is retried with the members that answer, as without overlap; the last
  // round is exchanged without anything to overlap.
  void LoopOverlapped() {
    std::optional<InFlight> flight;
    uint32_t min_attempt = 0;
    uint64_t attempt_round = 0;
    bool first_member = false;
    while (!stopping) {
      uint64_t next;
      {
        absl::MutexLock lock(&mu);
        next = certified_round + 1;
        status.set_wall_seconds((host.clock->MonotonicMs() - start_ms) / 1000.0);
      }
      if (next > spec.spec.rounds()) {
        Settle(first_member);
        while (!stopping) Sleep(200);
        return;
      }
      if (!loaded && !flight) {
        deltas.clear();
        CatchUpFromAnyone();
        if (!loaded) {
          Sleep(500);
          continue;
        }
      }
      if (attempt_round != next) {
        attempt_round = next;
        min_attempt = 0;
      }
      const uint64_t inner_round = flight ? next + 1 : next;
      if (inner_round <= spec.spec.rounds() && !deltas.contains(inner_round)) {
        absl::Status s;
        {
          std::jthread told = PreAnnounce(inner_round, min_attempt);
          s = InnerSteps(inner_round, flight ? DeltaName(next) : std::string());
        }
        if (!s.ok()) {
          flight.reset();  // waits for its allreduce (bounded by the exchange deadline)
          deltas.clear();
          if (!InnerStepsFailed(inner_round, s)) return;
          continue;
        }
      }
      if (flight) {
        InFlight f = std::move(*flight);
        flight.reset();
        absl::StatusOr<Reduced> reduced = f.reduced.get();
        absl::Status done = reduced.status();
        if (reduced.ok()) done = Finish(*reduced, f.info.train_loss, f.info.inner_seconds);
        if (done.ok()) continue;
        min_attempt = f.plan.attempt() + 1;
        if (!AttemptFailed(f.plan, done)) return;
        continue;
      }
      auto info = deltas.find(next);
      if (info == deltas.end()) continue;
      std::optional<pb::RoundPlan> plan = PlanWithThisHost(next, min_attempt);
      if (!plan) continue;
      SetState("training");
      first_member = plan->members(0).address() == host.address;
      if (next < spec.spec.rounds()) {
        flight = InFlight{.plan = *plan, .info = info->second, .reduced = {}};
        flight->reduced = std::async(std::launch::async, [this, p = *plan] { return Reduce(p); });
        continue;
      }
      absl::StatusOr<Reduced> reduced = Reduce(*plan);
      absl::Status done = reduced.status();
      if (reduced.ok())
        done = Finish(*reduced, info->second.train_loss, info->second.inner_seconds);
      if (done.ok()) continue;
      min_attempt = plan->attempt() + 1;
      if (!AttemptFailed(*plan, done)) return;
    }
  }

  // A worker that died is started again from the records (certified checkpoint, data), at most
  // kWorkerRestartsMax times; then the run fails, and `shard run` or a daemon restart resumes it.
  bool RestartWorker(const absl::Status& why) {
    if (stopping) return false;
    ShareEvalTarget(false);
    std::string how = worker->Stop().ToString();
    if (++worker_restarts > kWorkerRestartsMax) {
      Fail(absl::UnavailableError(absl::StrCat("the worker died ", worker_restarts,
                                               " times; last: ", why.message(), " (", how, ")")));
      return false;
    }
    Transition(absl::StrCat("the worker died (", how, "); starting it again"));
    {
      absl::MutexLock lock(&mu);
      status.set_worker_restarts(worker_restarts);
    }
    worker.reset();
    delta_round = 0;
    deltas.clear();
    loaded = false;
    if (absl::Status again = Prepare(); !again.ok()) {
      Fail(again);
      return false;
    }
    return true;
  }
};

std::unique_ptr<ShardRun> ShardRun::Start(const ShardRunHost& host, const ShardRunOptions& options,
                                          uint64_t shard_id, ParsedRunSpec spec) {
  auto impl = std::make_unique<Impl>(host, options, shard_id, spec);
  {
    absl::MutexLock lock(&impl->mu);
    impl->status.set_shard_id(shard_id);
    impl->status.set_state("starting");
    impl->status.set_rounds_total(spec.spec.rounds());
  }
  std::unique_ptr<ShardRun> run(new ShardRun(std::move(impl)));
  run->spec_ = std::move(spec);
  Impl* raw = run->impl_.get();
  raw->thread = std::thread([raw] { raw->Loop(); });
  return run;
}

ShardRun::ShardRun(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardRun::~ShardRun() { Stop(); }

void ShardRun::Stop() {
  if (impl_->stopping.exchange(true)) {
    if (impl_->thread.joinable()) impl_->thread.join();
    return;
  }
  // A model call in progress ends with the worker, an exchange with its meshes (a mesh still
  // connecting with the transport's StopConnecting); the thread then sees `stopping`.
  if (pid_t pid = impl_->worker_pid.load(); pid > 0) ::kill(pid, SIGTERM);
  {
    absl::MutexLock lock(&impl_->mu);
    for (Mesh* mesh : impl_->meshes) mesh->Abort(impl_->Stopping());
    if (impl_->stop_transport != nullptr) impl_->stop_transport->StopConnecting(impl_->Stopping());
  }
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->ShareEvalTarget(false);
  impl_->worker.reset();
}

pb::ShardRunStatus ShardRun::Status() const {
  absl::MutexLock lock(&impl_->mu);
  pb::ShardRunStatus s = impl_->status;
  if (impl_->start_ms > 0 && s.state() != "done") {
    s.set_wall_seconds((impl_->host.clock->MonotonicMs() - impl_->start_ms) / 1000.0);
  }
  return s;
}

pb::AnnounceResponse ShardRun::OnAnnounce(const std::string& signer,
                                          const pb::AnnounceRequest& request) {
  Impl& m = *impl_;
  pb::AnnounceResponse response;
  absl::MutexLock lock(&m.mu);
  response.set_certified_round(m.certified_round);
  if (request.round() <= m.certified_round) return response;
  if (request.round() > m.certified_round + 1) {
    response.set_note(absl::StrCat("this host is at round ", m.certified_round + 1));
    // With overlap, a member in the exchange of round c + 1 prepares round c + 2: expected,
    // not a sign that this host is behind.
    const bool overlapping =
        m.spec.spec.overlap() && request.preparing() && request.round() == m.certified_round + 2;
    if (!overlapping) m.ahead_peer = signer;
    return response;
  }
  m.rendezvous.Enter(request.round(), request.min_attempt());
  m.rendezvous.Announce(signer, {.endpoint = request.collective_endpoint(),
                                 .min_attempt = request.min_attempt(),
                                 .at_ms = m.host.clock->MonotonicMs(),
                                 .preparing = request.preparing()});
  response.set_attempt(m.rendezvous.attempt());
  if (const pb::RoundPlan* made = m.rendezvous.PlanFor(request.min_attempt()); made != nullptr) {
    *response.mutable_plan() = *made;
  } else {
    response.set_note("no plan yet");
  }
  return response;
}

absl::StatusOr<pb::GetCertificatesResponse> ShardRun::OnGetCertificates(
    const pb::GetCertificatesRequest& request) const {
  if (request.max() < 1 || request.max() > kCertificatesPerCallMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("max: ", request.max(), " is outside 1..", kCertificatesPerCallMax));
  }
  pb::GetCertificatesResponse response;
  TS_ASSIGN_OR_RETURN(
      std::vector<pb::RoundCertificate> certs,
      impl_->LoadCertificates(std::max<uint64_t>(1, request.from_round()), request.max()));
  for (auto& c : certs) *response.add_certificates() = std::move(c);
  absl::MutexLock lock(&impl_->mu);
  response.set_certified_round(impl_->certified_round);
  response.set_checkpoint_artifact_id(impl_->checkpoint_artifact);
  return response;
}

absl::StatusOr<pb::SignedEvaluation> ShardRun::EvaluateArtifact(const std::string& artifact_id,
                                                                uint64_t windows_max) {
  Impl& m = *impl_;
  // The artifact first (the host's store serves any thread), then what the run shares.
  TS_ASSIGN_OR_RETURN(std::vector<pb::ArtifactSummary> held, m.host.artifacts->List(m.shard_id));
  auto summary = std::find_if(held.begin(), held.end(), [&](const pb::ArtifactSummary& a) {
    return a.artifact_id() == artifact_id;
  });
  if (summary == held.end()) {
    return absl::NotFoundError(absl::StrCat("artifact ", common::HexEncode(artifact_id),
                                            " is not complete in this host's store of shard ",
                                            m.shard_id));
  }
  std::optional<Impl::EvalTarget> target;
  {
    absl::MutexLock lock(&m.mu);
    target = m.eval_target;
  }
  if (m.stopping) return absl::UnavailableError("the run is stopping");
  if (!target.has_value()) {
    return absl::UnavailableError("the run has not prepared its worker and data yet");
  }
  const std::string name = absl::StrCat("eval/", common::HexEncode(artifact_id));
  const std::string dir = absl::StrCat(target->work_dir, "/", name);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  TS_RETURN_IF_ERROR(m.host.artifacts->Export(m.shard_id, artifact_id, dir));
  pb::EvaluateRequest er;
  er.set_checkpoint_file(absl::StrCat(name, "/", kCheckpointFile));
  er.set_eval_file(target->eval_file);
  er.set_batch_size(target->eval_batch_size);
  er.set_windows_max(windows_max);
  auto ev = target->worker->client().Evaluate(er);
  std::filesystem::remove_all(dir, ec);
  TS_RETURN_IF_ERROR(ev.status());
  pb::SignedEvaluation out;
  pb::EvaluationResult* e = out.mutable_result();
  e->set_shard_id(m.shard_id);
  e->set_round(summary->round());
  e->set_checkpoint_root(ev->root());
  e->set_eval_set_id(ev->eval_id());
  e->set_loss_micro(static_cast<int64_t>(std::llround(ev->mean_loss() * 1e6)));
  e->set_tokens(ev->tokens());
  e->set_host(m.host.address);
  TS_ASSIGN_OR_RETURN(std::string sig, SignEvaluation(*m.host.key, m.host.chain_id, *e));
  out.set_signature(sig);
  return out;
}

absl::StatusOr<pb::Settlement> DraftFromRecords(const ShardRunHost& host, uint64_t shard_id,
                                                uint64_t rounds_total) {
  TS_ASSIGN_OR_RETURN(
      std::vector<pb::RoundCertificate> certs,
      // rounds_total is a validated run spec's (at most 100,000).
      LoadStoredCertificates(*host.db, shard_id, 1, static_cast<uint32_t>(rounds_total + 1)));
  if (certs.size() != rounds_total ||
      (!certs.empty() && certs.back().result().round() != rounds_total)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard_id, ": this host's records certify ", certs.size(), " of ",
                     rounds_total, " rounds; the run has not finished here"));
  }
  TS_ASSIGN_OR_RETURN(pb::Shard shard, host.chain_shard(shard_id));
  TS_ASSIGN_OR_RETURN(uint64_t escrow,
                      common::ParseAmount("shard.spec.escrow", shard.spec().escrow().amount()));
  return DraftSettlement(host.chain_id, shard_id, escrow, shard.spec().reward_policy(), certs,
                         rounds_total);
}

}  // namespace ts::sidecar
