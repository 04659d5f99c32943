// ts_byzantine_worker: a host operator's tampered worker, for the attack suite
// (tests/functional/test_attacks.py, docs/verification.md "Attacks"). Test-only; not installed.
//
// A host configured with it as its worker_binary gets a real ts_worker underneath: this process
// starts one ($TS_HONEST_WORKER) on a socket of its own, serves the Worker service on the socket
// the shard process named, passes every call through, and then does what the attack named in
// the file $TS_ATTACK_FILE says (read at every call, so a test switches attacks between
// shards; a missing file or "none": honest). On its own rounds (an InnerSteps that is not a
// replay) it commits instead of the Δ its worker computed:
//   free_rider   Δ = 0
//   copier       the previous round's aggregate (the others' work; 0 in the first round)
//   lazy         the Δ of a quarter of the assigned steps
//   noise        Δ + Gaussian noise of Δ's own RMS
//   scale100     100 · Δ
//   sign_flip    −Δ
//   alie         "a little is enough": per coordinate μ − 1.5·σ, with μ and σ the mean and
//                half-distance of its own Δ and the previous aggregate (commit before reveal
//                hides this round's others; honest in the first round)
//   stale        its own honest Δ of the previous round (honest in the first)
//   wrong_data   the Δ of steps on another round's batches
// or commits its honest Δ with a false claim:
//   lying_scorer its steps' held-out score claimed 1 nat better than the worker computed
// and as an evaluator or a validator:
//   lying_evaluator  its own evaluations answer 1 nat less than the worker computed
//   lying_validator  every replay of another member's steps comes out a little off
//
// `--probe-device` is the real worker's answer (exec). Stops on SIGTERM or SIGINT, stopping the
// real worker first.
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/crypto/hash.h"
#include "common/process.h"
#include "gonka/trainshard/v1/worker.grpc.pb.h"
#include "worker/client/worker_client.h"

namespace ts::worker {
namespace {

constexpr std::string_view kAttacks[] = {
    "none",        "free_rider", "copier", "lazy",       "noise",           "scale100",
    "sign_flip",   "alie",       "stale",  "wrong_data", "lying_evaluator", "lying_validator",
    "lying_scorer"};

bool KnownAttack(std::string_view a) {
  for (std::string_view k : kAttacks) {
    if (a == k) return true;
  }
  return false;
}

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::StatusOr<std::vector<float>> ReadValues(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("byzantine: cannot read ", path));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() % sizeof(float) != 0) {
    return absl::DataLossError(absl::StrCat("byzantine: ", path, " is not whole floats"));
  }
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

// Writes `values` to `path` and returns the bytes' SHA-256.
absl::StatusOr<std::string> WriteValues(const std::string& path, const std::vector<float>& values) {
  std::string bytes(values.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("byzantine: cannot write ", path));
  return common::Sha256(bytes);
}

class ByzantineWorker final : public pb::Worker::Service {
 public:
  ByzantineWorker(WorkerClient* honest, std::string work_dir, std::string attack_file)
      : honest_(honest), work_dir_(std::move(work_dir)), attack_file_(std::move(attack_file)) {}

  grpc::Status InitModel(grpc::ServerContext*, const pb::InitModelRequest* request,
                         pb::InitModelResponse* response) override {
    return Pass(honest_->InitModel(*request), response);
  }
  grpc::Status LoadCheckpoint(grpc::ServerContext*, const pb::LoadCheckpointRequest* request,
                              pb::LoadCheckpointResponse* response) override {
    return Pass(honest_->LoadCheckpoint(*request), response);
  }
  grpc::Status Sample(grpc::ServerContext*, const pb::SampleRequest* request,
                      pb::SampleResponse* response) override {
    return Pass(honest_->Sample(*request), response);
  }
  grpc::Status Status(grpc::ServerContext*, const pb::WorkerStatusRequest*,
                      pb::WorkerStatusResponse* response) override {
    return Pass(honest_->Status(), response);
  }
  grpc::Status PrepareData(grpc::ServerContext*, const pb::PrepareDataRequest* request,
                           pb::PrepareDataResponse* response) override {
    return Pass(honest_->PrepareData(*request), response);
  }

  grpc::Status OuterStep(grpc::ServerContext*, const pb::OuterStepRequest* request,
                         pb::OuterStepResponse* response) override {
    // The aggregate, which the copier and ALIE use in the next round.
    absl::StatusOr<std::vector<float>> aggregate = ReadValues(Path(request->delta_file()));
    grpc::Status status = Pass(honest_->OuterStep(*request), response);
    if (status.ok() && aggregate.ok()) {
      absl::MutexLock lock(&mu_);
      aggregate_ = *std::move(aggregate);
    }
    return status;
  }

  grpc::Status Evaluate(grpc::ServerContext*, const pb::EvaluateRequest* request,
                        pb::EvaluateResponse* response) override {
    grpc::Status status = Pass(honest_->Evaluate(*request), response);
    // Its own evaluations (of the current checkpoint), not its re-evaluations of others'.
    if (status.ok() && Attack() == "lying_evaluator" && request->checkpoint_file().empty()) {
      response->set_mean_loss(std::max(0.01, response->mean_loss() - 1.0));
    }
    return status;
  }

  grpc::Status InnerSteps(grpc::ServerContext*, const pb::InnerStepsRequest* request,
                          pb::InnerStepsResponse* response) override {
    const std::string attack = Attack();
    const bool replay = !request->replay_checkpoint_file().empty();
    pb::InnerStepsRequest sent = *request;
    if (!replay && attack == "lazy") sent.set_steps(std::max<uint32_t>(1, request->steps() / 4));
    if (!replay && attack == "wrong_data") {
      sent.set_data_seed(
          common::Sha256(absl::StrCat("another round's data ", request->data_seed())));
    }
    grpc::Status status = Pass(honest_->InnerSteps(sent), response);
    if (!status.ok()) return status;
    if (!replay && attack == "lying_scorer") {
      response->set_score_loss(std::max(0.01, response->score_loss() - 1.0));
      return status;
    }
    if (replay && attack != "lying_validator") return status;
    const std::string path = Path(request->delta_file());
    absl::StatusOr<std::vector<float>> delta = ReadValues(path);
    if (!delta.ok()) return ToGrpc(delta.status());
    std::vector<float> committed = Tamper(attack, replay, request->round(), *delta);
    absl::StatusOr<std::string> sha = WriteValues(path, committed);
    if (!sha.ok()) return ToGrpc(sha.status());
    response->set_delta_sha256(*sha);
    if (!replay) {
      absl::MutexLock lock(&mu_);
      own_ = *std::move(delta);
    }
    return status;
  }

 private:
  template <typename Response>
  static grpc::Status Pass(absl::StatusOr<Response> answer, Response* response) {
    if (!answer.ok()) return ToGrpc(answer.status());
    *response = *std::move(answer);
    return grpc::Status::OK;
  }

  std::string Path(const std::string& name) const { return absl::StrCat(work_dir_, "/", name); }

  std::string Attack() const {
    std::ifstream in(attack_file_);
    std::string attack;
    if (!(in >> attack) || !KnownAttack(attack)) return "none";
    return attack;
  }

  // What the attack commits instead of the worker's Δ `d` (a replay's, for the lying
  // validator).
  std::vector<float> Tamper(const std::string& attack, bool replay, uint64_t round,
                            const std::vector<float>& d) {
    absl::MutexLock lock(&mu_);
    const bool have_aggregate = aggregate_.size() == d.size();
    std::vector<float> out = d;
    if (replay) {
      out[0] += 1e-3F;
    } else if (attack == "free_rider") {
      out.assign(d.size(), 0.0F);
    } else if (attack == "copier") {
      out = have_aggregate ? aggregate_ : std::vector<float>(d.size(), 0.0F);
    } else if (attack == "noise") {
      double sum = 0;
      for (float v : d) sum += static_cast<double>(v) * v;
      const float rms = static_cast<float>(std::sqrt(sum / static_cast<double>(d.size())));
      std::mt19937_64 rng(round);
      std::normal_distribution<float> noise(0.0F, rms);
      for (float& v : out) v += noise(rng);
    } else if (attack == "scale100") {
      for (float& v : out) v *= 100.0F;
    } else if (attack == "sign_flip") {
      for (float& v : out) v = -v;
    } else if (attack == "alie" && have_aggregate) {
      for (size_t i = 0; i < d.size(); ++i) {
        const float mu = (d[i] + aggregate_[i]) / 2;
        const float sigma = std::fabs(d[i] - aggregate_[i]) / 2;
        out[i] = mu - 1.5F * sigma;
      }
    } else if (attack == "stale" && own_.size() == d.size()) {
      out = own_;
    }
    return out;
  }

  WorkerClient* honest_;
  const std::string work_dir_;
  const std::string attack_file_;
  absl::Mutex mu_;
  std::vector<float> aggregate_ ABSL_GUARDED_BY(mu_);  // the latest outer step's aggregate
  std::vector<float> own_ ABSL_GUARDED_BY(mu_);        // this host's honest Δ of its last round
};

int Fail(std::string_view message) {
  std::fprintf(stderr, "ts_byzantine_worker: %.*s\n", static_cast<int>(message.size()),
               message.data());
  return 1;
}

int Main(int argc, char** argv) {
  const char* honest_binary = std::getenv("TS_HONEST_WORKER");
  if (honest_binary == nullptr) return Fail("TS_HONEST_WORKER is not set");
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args) {
    if (a == "--probe-device") {
      std::vector<char*> exec_args{const_cast<char*>(honest_binary)};
      for (int i = 1; i < argc; ++i) exec_args.push_back(argv[i]);
      exec_args.push_back(nullptr);
      ::execv(honest_binary, exec_args.data());
      return Fail(absl::StrCat("cannot exec ", honest_binary));
    }
  }
  WorkerProcessOptions options{.binary = honest_binary};
  for (size_t i = 0; i < args.size(); ++i) {
    const bool has_value = i + 1 < args.size();
    if (args[i] == "--socket" && has_value) {
      options.socket_path = args[++i];
    } else if (args[i] == "--work-dir" && has_value) {
      options.work_dir = args[++i];
    } else if (args[i] == "--threads" && has_value) {
      options.threads = std::atoi(args[++i].c_str());
    } else {
      options.extra_args.push_back(args[i]);
    }
  }
  if (options.socket_path.empty()) return Fail("--socket is missing");
  const std::string socket_path = options.socket_path;
  options.socket_path += "h";
  const char* attack_file = std::getenv("TS_ATTACK_FILE");
  const sigset_t signals = common::BlockStopSignals();
  absl::StatusOr<std::unique_ptr<WorkerProcess>> honest = WorkerProcess::Start(options);
  if (!honest.ok()) return Fail(honest.status().ToString());

  ByzantineWorker service(&(*honest)->client(), options.work_dir,
                          attack_file != nullptr ? attack_file : "");
  std::unique_ptr<grpc::Server> server = ServeWorker(socket_path, &service);
  if (server == nullptr) return Fail(absl::StrCat("cannot serve on unix:", socket_path));
  int sig = 0;
  while (sig != SIGTERM && sig != SIGINT) sig = sigwaitinfo(&signals, nullptr);
  (void)(*honest)->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server->Wait();
  ::unlink(socket_path.c_str());
  return 0;
}

}  // namespace
}  // namespace ts::worker

int main(int argc, char** argv) { return ts::worker::Main(argc, argv); }
