#include "tests/bench/bench_training.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status.h"
#include "worker/dataset_manifest.h"
#include "worker/tokenizer.h"

namespace ts::bench {
namespace {

constexpr char kChain[] = "trainshard-bench";

}  // namespace

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool FlagNumber(int argc, char** argv, int* i, double* v) {
  if (*i + 1 >= argc) return false;
  char* end = nullptr;
  *v = std::strtod(argv[++*i], &end);
  return end != argv[*i] && *end == '\0';
}

absl::StatusOr<BenchCorpus> LoadBenchCorpus(uint32_t files, uint32_t vocab) {
  BenchCorpus c;
  const auto names = worker::DefaultFortuneFiles().first(files);
  TS_ASSIGN_OR_RETURN(std::vector<std::string> docs,
                      worker::ReadFortuneFiles(worker::kFortunesDir, names));
  TS_ASSIGN_OR_RETURN(std::string model,
                      worker::TrainTokenizer(docs, {.vocab_size = vocab, .seed = 1}));
  TS_ASSIGN_OR_RETURN(std::unique_ptr<worker::Tokenizer> tok, worker::Tokenizer::Load(model));
  TS_ASSIGN_OR_RETURN(c.dataset, worker::BuildDataset(docs, *tok, {}));
  c.documents = docs.size();
  for (const worker::DataShard& s : c.dataset.train) {
    c.train_tokens += s.tokens.size();
    c.refs.push_back({worker::DataShardId(worker::EncodeDataShard(s)), s.tokens.size()});
  }
  return c;
}

absl::StatusOr<BenchCorpus> LoadPackedBenchCorpus(const std::string& dir) {
  TS_ASSIGN_OR_RETURN(worker::PackedDataset packed, worker::ReadPackedDataset(dir));
  auto read = [&](const worker::PackedShard& s) -> absl::StatusOr<worker::DataShard> {
    std::ifstream in(dir + "/" + s.file, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    return worker::DecodeDataShard(bytes.str());
  };
  BenchCorpus c;
  for (const worker::PackedShard& s : packed.train) {
    TS_ASSIGN_OR_RETURN(worker::DataShard shard, read(s));
    c.train_tokens += shard.tokens.size();
    c.refs.push_back({s.id, shard.tokens.size()});
    c.dataset.train.push_back(std::move(shard));
  }
  TS_ASSIGN_OR_RETURN(c.dataset.eval, read(packed.eval));
  c.documents = packed.documents;
  c.dataset.documents = packed.documents;
  return c;
}

absl::StatusOr<std::vector<worker::TokenBatch>> RoundBatches(const BenchCorpus& corpus,
                                                             const worker::ModelConfig& config,
                                                             uint64_t round, uint32_t member,
                                                             uint32_t steps, uint32_t batch) {
  TS_ASSIGN_OR_RETURN(worker::Assignment a,
                      worker::AssignBatches({.data_seed = absl::StrCat("diloco-bench/", round),
                                             .round = round,
                                             .host = absl::StrCat("host-", member),
                                             .shards = corpus.refs,
                                             .steps = steps,
                                             .batch_size = batch,
                                             .context = config.context}));
  return worker::GatherBatches(a, corpus.dataset.train);
}

absl::StatusOr<std::unique_ptr<BenchMesh>> BenchMesh::Start(
    uint32_t k, std::optional<test_util::LinkOptions> link) {
  auto m = std::unique_ptr<BenchMesh>(new BenchMesh());
  for (uint32_t i = 0; i < k; ++i) {
    m->keys_.push_back(common::PrivateKey::Generate());
    sidecar::TcpTransportOptions options;
    options.chain_id = kChain;
    TS_ASSIGN_OR_RETURN(
        std::unique_ptr<sidecar::TcpTransport> t,
        sidecar::TcpTransport::Start(m->keys_.back(), options, &common::SystemClock()));
    std::string endpoint = t->endpoint();
    if (link.has_value()) {
      TS_ASSIGN_OR_RETURN(std::unique_ptr<test_util::LinkEmulator> e,
                          test_util::LinkEmulator::Start(endpoint, *link));
      endpoint = e->endpoint();
      m->links_.push_back(std::move(e));
    }
    m->group_.members.push_back({t->address(), endpoint});
    m->transports_.push_back(std::move(t));
  }
  m->group_.shard_id = 1;
  return m;
}

BenchMesh::~BenchMesh() {
  // Meshes before their transports; the links after both, so the closes get through.
  collectives_.clear();
  meshes_.clear();
  transports_.clear();
  links_.clear();
}

absl::Status BenchMesh::Open() {
  collectives_.clear();
  meshes_.clear();
  group_.session++;
  const size_t k = transports_.size();
  std::vector<absl::StatusOr<std::unique_ptr<sidecar::Mesh>>> got;
  for (size_t i = 0; i < k; ++i) got.emplace_back(absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  const int64_t deadline = common::SystemClock().MonotonicMs() + 30000;
  for (size_t i = 0; i < k; ++i) {
    threads.emplace_back([&, i] { got[i] = transports_[i]->Connect(group_, i, deadline); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < k; ++i) {
    if (!got[i].ok()) return got[i].status();
    meshes_.push_back(std::move(*got[i]));
    collectives_.push_back(std::make_unique<sidecar::Collective>(meshes_.back().get(), &keys_[i],
                                                                 kChain, &common::SystemClock()));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> BenchMesh::AllReduceMean(std::vector<std::vector<float>>& data,
                                                  sidecar::CodecSpec codec) {
  const size_t k = collectives_.size();
  sidecar::OpOptions o;
  o.op_id = NextOpId();
  o.codec = codec;
  o.reduce = sidecar::ReduceOp::kMean;
  o.deadline_ms = common::SystemClock().MonotonicMs() + 60000;
  std::vector<absl::StatusOr<sidecar::OpStats>> stats(k, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < k; ++i) {
    threads.emplace_back([&, i] { stats[i] = collectives_[i]->AllReduce(o, data[i]); });
  }
  for (auto& t : threads) t.join();
  uint64_t bytes = 0;
  for (size_t i = 0; i < k; ++i) {
    if (!stats[i].ok()) return stats[i].status();
    bytes += stats[i]->wire_bytes_sent;
    if (std::memcmp(data[i].data(), data[0].data(), data[0].size() * sizeof(float)) != 0) {
      return absl::InternalError(absl::StrCat("member ", i, " got other bits than member 0"));
    }
  }
  return bytes;
}

}  // namespace ts::bench
