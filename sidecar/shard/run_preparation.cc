#include "sidecar/shard/run_preparation.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "sidecar/shard/checkpoint_publishing.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
constexpr int64_t kDatasetReportMs = 30'000;
constexpr int64_t kDatasetRetryMs = 2000;

}  // namespace

absl::Status RunPreparation::Prepare() {
  TS_RETURN_IF_ERROR(StartWorker());
  TS_RETURN_IF_ERROR(PrepareData());
  run_.ShareEvalTarget(true);
  if (run_.transport == nullptr) {
    TS_RETURN_IF_ERROR(StartTransport());
    absl::MutexLock lock(&run_.mu);
    run_.stop_transport = run_.transport.get();
    if (run_.stopping) run_.transport->StopConnecting(run_.Stopping());
  }
  return InitAndRestore();
}

absl::Status RunPreparation::StartTransport() {
  if (run_.host.start_transport) {
    TS_ASSIGN_OR_RETURN(StartedTransport started, run_.host.start_transport());
    run_.transport = std::move(started.transport);
    run_.collective_endpoint = std::move(started.endpoint);
    return absl::OkStatus();
  }
  TcpTransportOptions to;
  to.listen_address = run_.options.collective_host + ":0";
  to.chain_id = run_.host.chain_id;
  to.heartbeat_interval_ms = run_.options.heartbeat_interval_ms;
  to.tls = run_.host.tls;
  TS_ASSIGN_OR_RETURN(std::unique_ptr<TcpTransport> tcp,
                      TcpTransport::Start(*run_.host.key, to, run_.host.clock));
  run_.collective_endpoint = tcp->endpoint();
  run_.transport = std::move(tcp);
  return absl::OkStatus();
}

absl::Status RunPreparation::StartWorker() {
  run_.dir = absl::StrCat(run_.options.work_root, "/", run_.shard_id);
  run_.work_dir = run_.dir + "/work";
  std::error_code ec;
  std::filesystem::create_directories(run_.work_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(run_.work_dir, ": ", ec.message()));
  std::string socket = run_.dir + "/worker.sock";
  if (socket.size() > 100) {
    socket = absl::StrCat("/tmp/ts-worker-", ::getpid(), "-", run_.shard_id, ".sock");
  }
  const ShardRunOptions& options = run_.options;
  worker::WorkerProcessOptions wo;
  wo.binary = options.worker_binary;
  wo.socket_path = socket;
  wo.work_dir = run_.work_dir;
  wo.threads = options.worker_threads;
  wo.extra_args = {"--device", options.worker_device};
  if (options.worker_memory_bytes_max != 0) {
    wo.extra_args.push_back("--memory-bytes-max");
    wo.extra_args.push_back(absl::StrCat(options.worker_memory_bytes_max));
  }
  wo.log_file = run_.dir + "/worker.log";
  TS_ASSIGN_OR_RETURN(run_.worker,
                      run_.host.start_worker ? run_.host.start_worker(wo) : StartWorkerProcess(wo));
  run_.worker_pid = run_.worker->pid();
  // Where it trains, as the worker itself says (--device auto resolves there).
  TS_ASSIGN_OR_RETURN(pb::WorkerStatusResponse about, run_.worker->Status());
  const std::string device =
      about.device() == "cuda" ? absl::StrCat("cuda (", about.device_name(), ")") : about.device();
  {
    absl::MutexLock lock(&run_.mu);
    run_.status.set_worker_device(device);
  }
  run_.Transition(absl::StrCat("worker started (pid ", run_.worker->pid(), ", ",
                               options.worker_threads, " threads, ", device, ")"));
  return absl::OkStatus();
}

// Builds the run's data through the worker (deterministic: the same bytes on every host)
// and checks it against the spec's pinned root; for a packed dataset, finds it among the
// members' dataset artifacts instead (PreparePacked).
absl::Status RunPreparation::PrepareData() {
  const pb::DataSpec& d = run_.spec.spec.data();
  if (d.corpus() == "packed") return PreparePacked();
  pb::PrepareDataRequest prep;
  prep.set_corpus(d.corpus());
  prep.set_files(d.files());
  prep.set_vocab(d.vocab());
  prep.set_shard_tokens(d.shard_tokens());
  prep.set_eval_every(d.eval_every());
  prep.set_out_dir("data");
  TS_ASSIGN_OR_RETURN(run_.data, run_.worker->PrepareData(prep));
  const pb::PrepareDataResponse& data = run_.data;
  std::string ids;
  for (const auto& id : data.shard_ids()) ids += id;
  ids += data.eval_id();
  const std::string dataset_root = common::Sha256(ids);
  if (!d.dataset_root().empty() && d.dataset_root() != dataset_root) {
    return absl::FailedPreconditionError(
        absl::StrCat("data: the prepared data set has root ", common::HexEncode(dataset_root),
                     ", the run spec pins ", common::HexEncode(d.dataset_root())));
  }
  run_.Transition(absl::StrCat("data prepared: ", data.shard_files_size(), " training shards, ",
                               data.train_tokens(), " + ", data.eval_tokens(),
                               " held-out tokens, root ", Hex8(dataset_root),
                               data.reused() ? " (the files on disk, re-verified)" : ""));
  if (!data_published_) PublishData();
  return absl::OkStatus();
}

// A packed dataset (docs/training.md "Data"): the run's data is the dataset artifact whose
// files give the spec's root. This host's store is looked in first (its operator may have
// published it), then the other members' (ArtifactOperator.Find); each candidate is fetched
// from the members that hold it, exported, and checked — every file's hash and the root —
// before it is used. Tried again every few seconds until one is found or the run stops.
absl::Status RunPreparation::PreparePacked() {
  const std::string want = run_.spec.spec.data().dataset_root();
  const std::string data_dir = run_.Path("data");
  std::set<std::string> tried;
  int64_t last_report_ms = 0;
  while (!run_.stopping) {
    // A dataset exported before (a restart) is checked again like any other.
    if (std::filesystem::exists(data_dir + "/" + worker::kDatasetManifestFile)) {
      auto here = worker::ReadPackedDataset(data_dir);
      if (here.ok() && here->root == want) return UsePacked(*here);
      std::error_code ec;
      std::filesystem::remove_all(data_dir, ec);
    }
    std::vector<std::pair<std::string, std::vector<std::string>>> candidates;  // id, holders
    if (auto local = run_.host.artifacts->List(run_.shard_id); local.ok()) {
      for (const auto& a : *local) {
        if (a.kind() == "dataset") candidates.push_back({a.artifact_id(), {}});
      }
    }
    std::string unanswered;
    if (auto found = run_.host.artifacts->Find(run_.shard_id, "dataset"); found.ok()) {
      for (const auto& f : found->artifacts()) {
        candidates.push_back({f.summary().artifact_id(), {f.holders().begin(), f.holders().end()}});
      }
      unanswered = absl::StrJoin(found->unanswered(), "; ");
    } else {
      unanswered = std::string(found.status().message());
    }
    for (const auto& [id, holders] : candidates) {
      if (run_.stopping) break;
      if (!tried.insert(id).second) continue;
      absl::Status placed = TryDataset(id, holders);
      if (absl::IsUnavailable(placed)) tried.erase(id);  // a fetch may fail now and work later
      if (absl::IsInternal(placed)) return placed;
      if (!placed.ok()) continue;
      TS_ASSIGN_OR_RETURN(worker::PackedDataset moved, worker::ReadPackedDataset(data_dir));
      run_.Transition(absl::StrCat("dataset ", Hex8(want), " fetched as artifact ", Hex8(id)));
      data_published_ = true;  // it is an artifact of the shard already
      return UsePacked(moved);
    }
    const int64_t now = run_.host.clock->MonotonicMs();
    if (now - last_report_ms > kDatasetReportMs) {
      run_.Transition(absl::StrCat("waiting for the dataset ", Hex8(want),
                                   " to be published by a member",
                                   unanswered.empty() ? "" : absl::StrCat(" (", unanswered, ")")));
      last_report_ms = now;
    }
    run_.Sleep(kDatasetRetryMs);
  }
  return run_.Stopping();
}

absl::Status RunPreparation::TryDataset(const std::string& id,
                                        const std::vector<std::string>& holders) {
  const uint64_t shard_id = run_.shard_id;
  if (!holders.empty()) {
    auto fetched =
        run_.host.artifacts->Fetch(shard_id, id, holders, [this] { return !!run_.stopping; });
    if (!fetched.ok()) {
      run_.Transition(
          absl::StrCat("dataset ", Hex8(id), " not fetched: ", fetched.status().message()));
      return absl::UnavailableError("not fetched");
    }
  }
  const std::string candidate_dir = run_.Path(absl::StrCat("data-", Hex8(id)));
  std::error_code ec;
  std::filesystem::remove_all(candidate_dir, ec);
  if (absl::Status exported = run_.host.artifacts->Export(shard_id, id, candidate_dir);
      !exported.ok()) {
    run_.Transition(absl::StrCat("dataset ", Hex8(id), " not exported: ", exported.message()));
    return absl::NotFoundError("not exported");
  }
  auto dataset = worker::ReadPackedDataset(candidate_dir);
  const std::string want = run_.spec.spec.data().dataset_root();
  if (!dataset.ok() || dataset->root != want) {
    run_.Transition(absl::StrCat(
        "dataset artifact ", Hex8(id), " is not the run's: ",
        dataset.ok() ? absl::StrCat("root ", Hex8(dataset->root)) : dataset.status().message()));
    std::filesystem::remove_all(candidate_dir, ec);
    return absl::NotFoundError("not the run's");
  }
  const std::string data_dir = run_.Path("data");
  std::filesystem::rename(candidate_dir, data_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(data_dir, ": ", ec.message()));
  return absl::OkStatus();
}

// The run's data files from a checked packed dataset in <work>/data.
absl::Status RunPreparation::UsePacked(const worker::PackedDataset& dataset) {
  if (dataset.vocab != run_.spec.spec.data().vocab()) {
    return absl::FailedPreconditionError(
        absl::StrCat("data: the packed dataset's tokenizer has ", dataset.vocab,
                     " pieces, the run spec's data.vocab is ", run_.spec.spec.data().vocab()));
  }
  pb::PrepareDataResponse& data = run_.data;
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
  run_.Transition(absl::StrCat("data: packed dataset ", Hex8(dataset.root), ", ",
                               dataset.train.size(), " training shards, ", train_tokens, " + ",
                               dataset.eval.tokens, " held-out tokens"));
  return absl::OkStatus();
}

// Makes the round-0 checkpoint, evaluates it, and loads the last certified checkpoint when
// the records hold certificates.
absl::Status RunPreparation::InitAndRestore() {
  TS_ASSIGN_OR_RETURN(std::vector<pb::RoundCertificate> certs,
                      run_.LoadCertificates(1, std::numeric_limits<uint32_t>::max()));
  TS_RETURN_IF_ERROR(run_.MakeDir(CheckpointDir(0)));
  RunWorker& client = *run_.worker;
  pb::InitModelRequest init;
  *init.mutable_spec() = run_.spec.spec.model();
  init.set_checkpoint_file(CheckpointName(0));
  TS_ASSIGN_OR_RETURN(pb::InitModelResponse made, client.InitModel(init));
  run_.parameters = made.parameters();
  {
    absl::MutexLock lock(&run_.mu);
    run_.status.set_parameters(made.parameters());
    run_.status.set_checkpoint_bytes(made.checkpoint_bytes());
    if (certs.empty()) {
      run_.certified_round = 0;
      run_.certified_root = made.root();
      run_.certified_base_root = made.root();
      run_.status.set_root(made.root());
    }
  }
  run_.loaded = true;
  pb::EvaluateRequest er = run_.EvaluateRequestOf();
  er.set_checkpoint_file(CheckpointName(0));
  TS_ASSIGN_OR_RETURN(pb::EvaluateResponse ev, client.Evaluate(er));
  {
    absl::MutexLock lock(&run_.mu);
    run_.status.set_initial_eval_loss_micro(LossMicroOf(ev.mean_loss()));
  }
  if (certs.empty()) {
    run_.Transition(absl::StrCat("round-0 checkpoint ", Hex8(made.root()), " (", made.parameters(),
                                 " parameters)"));
    return absl::OkStatus();
  }
  const pb::RoundCertificate& last = certs.back();
  run_.AdoptCertified(last);
  bool recorded;
  {
    absl::MutexLock lock(&run_.mu);
    recorded = run_.status.rounds_size() > 0;
  }
  if (!recorded) {
    for (const auto& c : certs) run_.RecordRound(c, 0, run_.round_inner_seconds);
  }
  pb::LoadCheckpointRequest load;
  load.set_checkpoint_file(CheckpointName(last.result().round()));
  load.set_expected_root(last.result().new_root());
  run_.loaded = client.LoadCheckpoint(load).ok();
  if (run_.loaded) RepublishCheckpoint(run_, last.result().round());
  run_.Transition(absl::StrCat(
      "restarted at certified round ", last.result().round(), ": ",
      run_.loaded ? "checkpoint found locally" : "checkpoint to be fetched from the members"));
  return absl::OkStatus();
}

void RunPreparation::PublishData() {
  auto published = run_.host.artifacts->Publish(run_.shard_id, run_.Path("data"), "dataset", 0);
  data_published_ = published.ok();
  if (published.ok()) {
    run_.Transition(absl::StrCat("data set published as artifact ", Hex8(*published)));
  } else {
    run_.Transition(absl::StrCat("data set not published: ", published.status().message()));
  }
}

}  // namespace ts::sidecar
