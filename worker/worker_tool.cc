// ts_worker_tool: the worker's maths from the command line.
//   reference --out DIR [--seed N] [--inner-steps H] [--threads T]
//     Writes, for a tiny model and a fixed batch, the initial parameters, the batches, the
//     parameters after H inner AdamW steps, the pseudo-gradient, and the parameters and momentum
//     after one outer Nesterov step (.npy files) plus reference.json describing them; the input
//     of tests/functional/test_worker_reference.py.
//   train [--steps N] [--layers L] [--d-model D] [--heads A] [--context T] [--vocab V]
//         [--batch B] [--lr X] [--threads T] [--files F]
//     Trains a model on the real corpus and prints figures (params, steps/s, loss start -> end,
//     eval before -> after, a sample) and one JSON line.
//   throughput [--preset P] [--batch B] [--steps N] [--device cpu|cuda|auto] [--bf16] ...
//     Times training steps of a preset on random tokens; one JSON line (tokens/s, the step
//     losses, memory).
//   matmul [--device cuda] [--dtype bf16|fp32] [--n 8192]
//     Times a plain matrix product: the device's peak for MFU; one JSON line.
//   checkpoint --out FILE [--preset P]
//     Writes a preset's checkpoint at its initialization, streaming.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "CLI/CLI.hpp"
#include "common/hex.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint.h"
#include "worker/corpus.h"
#include "worker/model.h"
#include "worker/outer_step.h"
#include "worker/tokenizer.h"
#include "worker/trainer.h"

namespace ts::worker {
namespace {

// NumPy .npy version 1.0: magic, header length, a Python dict literal padded to 64 bytes.
template <typename T>
absl::Status WriteNpy(const std::filesystem::path& path, std::span<const T> values,
                      std::vector<uint64_t> shape, const char* descr) {
  std::string dims;
  for (uint64_t d : shape) dims += std::to_string(d) + ",";
  std::string header =
      std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
  std::ofstream f(path, std::ios::binary);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  if (!f) return absl::InternalError("cannot write " + path.string());
  return absl::OkStatus();
}

// The reference model of each family: small, with every feature on (llama: grouped-query
// attention, an untied head unless `tied`).
ModelConfig ReferenceConfig(const std::string& family, bool tied) {
  if (family == "llama") {
    return ModelConfig{.family = ModelFamily::kLlama,
                       .layers = 2,
                       .d_model = 32,
                       .heads = 4,
                       .context = 16,
                       .vocab = 64,
                       .mlp_ratio = 0,
                       .kv_heads = 2,
                       .mlp_hidden = 48,
                       .rope_theta = 10000,
                       .norm_eps = 1e-5f,
                       .tie_embeddings = tied};
  }
  return ModelConfig{
      .layers = 2, .d_model = 32, .heads = 4, .context = 16, .vocab = 64, .mlp_ratio = 4};
}

// The logits of `params` on the inputs of the first batch, [rows, context, vocab].
absl::StatusOr<std::vector<float>> ReferenceLogits(const ModelConfig& config,
                                                   std::span<const float> params,
                                                   const TokenBatch& batch) {
  torch::NoGradGuard no_grad;
  std::shared_ptr<LanguageModel> model = MakeModel(config);
  TS_RETURN_IF_ERROR(LoadParams(*model, params));
  model->eval();
  std::vector<int64_t> tokens(batch.tokens.begin(), batch.tokens.end());
  const torch::Tensor all =
      torch::from_blob(tokens.data(), {int64_t{batch.rows}, int64_t{batch.cols}}, torch::kLong);
  const torch::Tensor logits = model->Logits(all.slice(1, 0, int64_t{batch.cols} - 1)).contiguous();
  return std::vector<float>(logits.data_ptr<float>(), logits.data_ptr<float>() + logits.numel());
}

absl::Status Reference(const std::string& out_dir, uint64_t seed, uint32_t inner_steps, int threads,
                       const std::string& family, bool tied, const InnerOptions& options) {
  const ModelConfig config = ReferenceConfig(family, tied);
  const AdamWOptions adamw{.lr = 1e-3f};
  const OuterOptions outer{};
  const RuntimeOptions runtime{.num_threads = threads};
  std::filesystem::create_directories(out_dir);
  const std::filesystem::path dir(out_dir);

  const std::vector<float> init = InitParams(config, seed);
  // Fixed batches: a SplitMix-like sequence over the vocabulary, 4 rows of context + 1.
  std::vector<TokenBatch> batches(inner_steps);
  std::vector<int64_t> all_tokens;
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (TokenBatch& b : batches) {
    b.rows = 4;
    b.cols = config.context + 1;
    for (uint32_t i = 0; i < b.rows * b.cols; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      b.tokens.push_back(static_cast<int64_t>(x % config.vocab));
    }
    all_tokens.insert(all_tokens.end(), b.tokens.begin(), b.tokens.end());
  }
  torch::set_num_threads(threads);
  TS_ASSIGN_OR_RETURN(std::vector<float> logits, ReferenceLogits(config, init, batches[0]));
  TS_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(config, adamw, runtime));
  TS_ASSIGN_OR_RETURN(InnerResult inner, trainer->InnerSteps(init, batches, options));

  // The outer step from a non-zero momentum buffer, so that its μ·m term is checked too.
  std::vector<float> momentum_in(init.size());
  for (size_t i = 0; i < momentum_in.size(); ++i) momentum_in[i] = inner.pseudo_gradient[i] * -0.5f;
  Checkpoint ck{config, init, momentum_in};
  TS_RETURN_IF_ERROR(OuterStep(ck.params, *ck.momentum, inner.pseudo_gradient, outer));
  // The logits of the checkpoint the tool writes: what its export must reproduce.
  TS_ASSIGN_OR_RETURN(std::vector<float> logits_after,
                      ReferenceLogits(config, ck.params, batches[0]));

  const uint64_t n = init.size();
  const uint32_t cols = config.context + 1;
  TS_RETURN_IF_ERROR(WriteNpy<float>(dir / "init.npy", init, {n}, "<f4"));
  TS_RETURN_IF_ERROR(
      WriteNpy<float>(dir / "logits.npy", logits, {4, config.context, config.vocab}, "<f4"));
  TS_RETURN_IF_ERROR(WriteNpy<float>(dir / "logits_after_outer.npy", logits_after,
                                     {4, config.context, config.vocab}, "<f4"));
  TS_RETURN_IF_ERROR(
      WriteNpy<int64_t>(dir / "batches.npy", all_tokens, {inner_steps, 4, cols}, "<i8"));
  TS_RETURN_IF_ERROR(WriteNpy<float>(dir / "after_inner.npy", inner.local_params, {n}, "<f4"));
  TS_RETURN_IF_ERROR(WriteNpy<float>(dir / "delta.npy", inner.pseudo_gradient, {n}, "<f4"));
  TS_RETURN_IF_ERROR(WriteNpy<float>(dir / "momentum_in.npy", momentum_in, {n}, "<f4"));
  TS_RETURN_IF_ERROR(WriteNpy<float>(dir / "after_outer.npy", ck.params, {n}, "<f4"));
  TS_RETURN_IF_ERROR(WriteNpy<float>(dir / "momentum_out.npy", *ck.momentum, {n}, "<f4"));
  const std::string encoded = EncodeCheckpoint(ck);
  {
    std::ofstream f(dir / "checkpoint.bin", std::ios::binary);
    f.write(encoded.data(), static_cast<std::streamsize>(encoded.size()));
  }

  nlohmann::json j;
  j["family"] = std::string(ModelFamilyName(config.family));
  j["config"] = {{"layers", config.layers},
                 {"d_model", config.d_model},
                 {"heads", config.heads},
                 {"context", config.context},
                 {"vocab", config.vocab},
                 {"mlp_ratio", config.mlp_ratio},
                 {"kv_heads", config.kv_heads},
                 {"mlp_hidden", config.mlp_hidden},
                 {"rope_theta", config.rope_theta},
                 {"norm_eps", config.norm_eps},
                 {"tie_embeddings", config.tie_embeddings}};
  j["adamw"] = {{"lr", adamw.lr},
                {"beta1", adamw.beta1},
                {"beta2", adamw.beta2},
                {"eps", adamw.eps},
                {"weight_decay", adamw.weight_decay},
                {"grad_clip_norm", adamw.grad_clip_norm},
                {"decay", "tensors of rank 2"}};
  j["outer"] = {{"lr", outer.lr}, {"momentum", outer.momentum}, {"nesterov", outer.nesterov}};
  j["inner"] = {{"micro_batch", options.micro_batch},
                {"first_step", options.first_step},
                {"warmup_steps", options.schedule.warmup_steps},
                {"total_steps", options.schedule.total_steps},
                {"min_lr_ratio", options.schedule.min_lr_ratio},
                {"schedule", std::string("linear warm-up, then cosine to min_lr_ratio at "
                                         "total_steps; constant after warm-up when total_steps "
                                         "is 0")}};
  j["seed"] = seed;
  j["inner_steps"] = inner_steps;
  j["threads"] = threads;
  j["losses"] = inner.losses;
  j["checkpoint_root"] = common::HexEncode(CheckpointRoot(encoded));
  nlohmann::json layout = nlohmann::json::array();
  for (const TensorSpec& t : ParameterLayout(config)) {
    layout.push_back({{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}});
  }
  j["layout"] = layout;
  j["files"] = {{"init", "init.npy"},
                {"logits", "logits.npy"},
                {"logits_after_outer", "logits_after_outer.npy"},
                {"batches", "batches.npy"},
                {"after_inner", "after_inner.npy"},
                {"delta", "delta.npy"},
                {"momentum_in", "momentum_in.npy"},
                {"after_outer", "after_outer.npy"},
                {"momentum_out", "momentum_out.npy"},
                {"checkpoint", "checkpoint.bin"}};
  std::ofstream(dir / "reference.json") << j.dump(2) << "\n";
  std::printf("reference: %llu params, losses", static_cast<unsigned long long>(n));
  for (float l : inner.losses) std::printf(" %.6f", l);
  std::printf(", checkpoint root %s\n", j["checkpoint_root"].get<std::string>().c_str());
  return absl::OkStatus();
}

struct ThroughputArgs {
  std::string preset = "20m";
  uint32_t vocab = 32000, context = 128, batch = 8, micro_batch = 0, steps = 6, warmup = 1;
  int threads = 2;
  bool checkpointing = false;
  bool probe = false;
  std::string device = "cpu";  // cpu | cuda | auto
  bool bf16 = false;           // bf16 autocast (CUDA only; fp32 on the CPU whatever it says)
};

// A line of /proc/self/status ("VmRSS", "VmHWM") in bytes; 0 if absent.
uint64_t ProcStatusBytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1)) * 1024;
  }
  return 0;
}

// Training throughput and memory of the worker's own path (Trainer::Load, then Steps: the
// parameters live in the model, never in a second copy), on random tokens — the speed of a step
// does not depend on what the tokens are. One untimed call of `warmup` steps, then one timed
// call of `steps` steps (as a round's inner steps are one call). Prints one JSON line: tokens per
// second, and the resident memory before the model and at its peak.
//
// With `probe`, instead: the model alone (no optimizer) and one forward and backward pass of one
// batch at the same micro-batch; the peak then is the parameters, their gradients and the pass's
// activations and temporaries, which is how the activations are told apart from the training
// state.
absl::Status Throughput(const ThroughputArgs& a) {
  using Clock = std::chrono::steady_clock;
  TS_ASSIGN_OR_RETURN(ModelConfig config, PresetConfig(a.preset, a.vocab, a.context));
  torch::set_num_threads(a.threads);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  auto batch = [&] {
    TokenBatch b;
    b.rows = a.batch;
    b.cols = a.context + 1;
    b.tokens.reserve(size_t{b.rows} * b.cols);
    for (uint32_t i = 0; i < b.rows * b.cols; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      b.tokens.push_back(static_cast<int64_t>(x % config.vocab));
    }
    return b;
  };
  const uint64_t params = ParameterCount(config);
  const uint64_t rss_before = ProcStatusBytes("VmRSS");
  if (a.probe) {
    std::shared_ptr<LanguageModel> model = MakeModel(config);
    const uint64_t rss_model = ProcStatusBytes("VmRSS");
    const TokenBatch one = batch();
    const int64_t micro = a.micro_batch == 0 ? a.batch : std::min(a.micro_batch, a.batch);
    torch::Tensor tokens = torch::from_blob(const_cast<int64_t*>(one.tokens.data()),
                                            {int64_t{one.rows}, int64_t{one.cols}}, torch::kLong);
    for (int64_t start = 0; start < int64_t{one.rows}; start += micro) {
      const torch::Tensor rows = tokens.slice(0, start, start + micro);
      const int64_t t = rows.size(1) - 1;
      const torch::Tensor logits = model->Logits(rows.slice(1, 0, t));
      torch::nn::functional::cross_entropy(logits.reshape({-1, int64_t{config.vocab}}),
                                           rows.slice(1, 1, t + 1).reshape({-1}))
          .backward();
    }
    nlohmann::json j = {{"impl", "trainshard-probe"},
                        {"params", params},
                        {"rss_before_model", rss_before},
                        {"rss_model", rss_model},
                        {"rss_after", ProcStatusBytes("VmRSS")},
                        {"rss_peak", ProcStatusBytes("VmHWM")}};
    std::printf("%s\n", j.dump().c_str());
    return absl::OkStatus();
  }
  TS_ASSIGN_OR_RETURN(Device device, ParseDevice("device", a.device));
  TS_ASSIGN_OR_RETURN(DeviceInfo info, ProbeDevice(device));
  TS_ASSIGN_OR_RETURN(
      std::unique_ptr<Trainer> trainer,
      Trainer::Create(config, {.lr = 1e-4f}, {.num_threads = a.threads, .device = info.device}));
  {
    std::vector<float> init = InitParams(config, 1);
    VectorReader reader(init);
    TS_RETURN_IF_ERROR(trainer->Load(reader));
  }
  InnerOptions options;
  options.micro_batch = a.micro_batch;
  options.activation_checkpointing = a.checkpointing;
  options.bf16 = a.bf16;
  std::vector<TokenBatch> warm, timed;
  for (uint32_t i = 0; i < a.warmup; ++i) warm.push_back(batch());
  for (uint32_t i = 0; i < a.steps; ++i) timed.push_back(batch());
  if (!warm.empty()) TS_RETURN_IF_ERROR(trainer->Steps(warm, options).status());
  options.first_step = a.warmup;
  const auto t0 = Clock::now();
  TS_ASSIGN_OR_RETURN(std::vector<float> losses, trainer->Steps(timed, options));
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const double tokens = static_cast<double>(a.batch) * a.context * a.steps;
  nlohmann::json j = {{"impl", "trainshard"},
                      {"device", std::string(DeviceName(info.device))},
                      {"device_name", info.name},
                      {"bf16", a.bf16 && info.device == Device::kCuda},
                      {"losses", losses},
                      {"model", ModelConfigString(config)},
                      {"params", params},
                      {"threads", a.threads},
                      {"batch", a.batch},
                      {"micro_batch", a.micro_batch},
                      {"context", a.context},
                      {"steps", a.steps},
                      {"seconds", seconds},
                      {"tokens_per_s", tokens / seconds},
                      {"loss_first", losses.front()},
                      {"loss_last", losses.back()},
                      {"rss_before_model", rss_before},
                      {"rss_peak", ProcStatusBytes("VmHWM")}};
  std::printf("%s\n", j.dump().c_str());
  return absl::OkStatus();
}

// The rate of a plain n × n × n matrix product on the device in `dtype` (bf16 or fp32), in
// TFLOP/s: the mean of `repeats` timed products after three untimed ones — the peak the MFU of
// training is also measured against (docs/benchmarks.md "GPU").
absl::Status MatmulPeak(const std::string& device_name, const std::string& dtype, int64_t n,
                        int repeats) {
  TS_ASSIGN_OR_RETURN(Device device, ParseDevice("device", device_name));
  TS_ASSIGN_OR_RETURN(DeviceInfo info, ProbeDevice(device));
  const torch::Device where = info.device == Device::kCuda ? torch::kCUDA : torch::kCPU;
  const auto type = dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  const auto options = torch::TensorOptions().dtype(type).device(where);
  torch::manual_seed(1);
  const torch::Tensor a = torch::randn({n, n}, options), b = torch::randn({n, n}, options);
  auto sync = [&] {
    if (where.is_cuda()) torch::cuda::synchronize();
  };
  for (int i = 0; i < 3; ++i) (void)torch::matmul(a, b);
  sync();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) (void)torch::matmul(a, b);
  sync();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double flops = 2.0 * static_cast<double>(n) * n * n * repeats;
  nlohmann::json j = {{"impl", "matmul"},
                      {"device", std::string(DeviceName(info.device))},
                      {"device_name", info.name},
                      {"dtype", dtype},
                      {"n", n},
                      {"repeats", repeats},
                      {"seconds", seconds},
                      {"tflops", flops / seconds / 1e12}};
  std::printf("%s\n", j.dump().c_str());
  return absl::OkStatus();
}

struct CheckpointArgs {
  std::string preset = "1b";
  uint32_t vocab = 32000, context = 2048;
  bool momentum = true;
  std::string out;
};

// A real checkpoint of a preset at its initialization (and a momentum buffer of the same
// length), written streaming: what a shard publishes and its members fetch, at any size.
absl::Status WriteCheckpoint(const CheckpointArgs& a) {
  TS_ASSIGN_OR_RETURN(ModelConfig config, PresetConfig(a.preset, a.vocab, a.context));
  const int fd = ::open(a.out.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat(a.out, ": ", std::strerror(errno)));
  FileByteWriter out(fd, a.out);
  const std::string header = EncodeCheckpointHeader(config, a.momentum);
  TS_RETURN_IF_ERROR(out.WriteBytes(header.data(), header.size()));
  const uint64_t n = ParameterCount(config);
  {
    const std::vector<float> init = InitParams(config, 1);
    FileValueWriter values(&out, n);
    TS_RETURN_IF_ERROR(values.Write(init));
  }
  if (a.momentum) {
    // Values of their own (a constant buffer would be one chunk repeated, which the artifact
    // store keeps and sends once).
    std::vector<float> momentum = InitParams(config, 2);
    for (float& v : momentum) v *= 1e-2f;
    FileValueWriter values(&out, n);
    TS_RETURN_IF_ERROR(values.Write(momentum));
  }
  TS_ASSIGN_OR_RETURN(std::string root, out.Close());
  nlohmann::json j = {{"file", a.out},
                      {"model", ModelConfigString(config)},
                      {"params", n},
                      {"bytes", out.written()},
                      {"root", common::HexEncode(root)}};
  std::printf("%s\n", j.dump().c_str());
  return absl::OkStatus();
}

struct TrainArgs {
  uint32_t steps = 300, batch = 8, files = 8;
  ModelConfig config{
      .layers = 2, .d_model = 64, .heads = 4, .context = 32, .vocab = 512, .mlp_ratio = 4};
  float lr = 2e-3f;
  int threads = 2;
};

absl::Status Train(const TrainArgs& a) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  const auto files = DefaultFortuneFiles().first(std::min<size_t>(a.files, 41));
  TS_ASSIGN_OR_RETURN(std::vector<std::string> docs, ReadFortuneFiles(kFortunesDir, files));
  auto t0 = Clock::now();
  TS_ASSIGN_OR_RETURN(std::string model,
                      TrainTokenizer(docs, {.vocab_size = a.config.vocab, .seed = 1}));
  const double tokenizer_s = seconds(t0);
  TS_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::Load(model));
  TS_ASSIGN_OR_RETURN(Dataset ds, BuildDataset(docs, *tok, {}));
  uint64_t train_tokens = 0;
  std::vector<ShardRef> refs;
  for (const DataShard& s : ds.train) {
    train_tokens += s.tokens.size();
    refs.push_back({DataShardId(EncodeDataShard(s)), s.tokens.size()});
  }
  TS_ASSIGN_OR_RETURN(Assignment assignment, AssignBatches({.data_seed = "seed",
                                                            .round = 0,
                                                            .host = "host",
                                                            .shards = refs,
                                                            .steps = a.steps,
                                                            .batch_size = a.batch,
                                                            .context = a.config.context}));
  TS_ASSIGN_OR_RETURN(std::vector<TokenBatch> batches, GatherBatches(assignment, ds.train));
  TS_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                      Trainer::Create(a.config, {.lr = a.lr}, {.num_threads = a.threads}));
  const std::vector<float> base = InitParams(a.config, 1);
  const EvalOptions eval{.batch_size = 32, .windows_max = 128};
  TS_ASSIGN_OR_RETURN(double eval_before, trainer->Evaluate(base, ds.eval, eval));
  t0 = Clock::now();
  TS_ASSIGN_OR_RETURN(InnerResult r, trainer->InnerSteps(base, batches));
  const double train_s = seconds(t0);
  TS_ASSIGN_OR_RETURN(double eval_after, trainer->Evaluate(r.local_params, ds.eval, eval));
  TS_ASSIGN_OR_RETURN(std::string sample,
                      SampleText(*trainer, r.local_params, *tok, "The", 40, 1, {.top_k = 40}));
  const uint64_t params = ParameterCount(a.config);
  std::printf(
      "corpus: %zu documents, %llu train tokens in %zu shards, %zu eval tokens; "
      "tokenizer %.2f s\n",
      docs.size(), static_cast<unsigned long long>(train_tokens), ds.train.size(),
      ds.eval.tokens.size(), tokenizer_s);
  std::printf("model: %s, %llu params, %d threads\n", ModelConfigString(a.config).c_str(),
              static_cast<unsigned long long>(params), a.threads);
  std::printf(
      "train: %u steps of %ux%u tokens in %.2f s = %.2f steps/s; loss %.3f -> %.3f; "
      "eval %.3f -> %.3f\n",
      a.steps, a.batch, a.config.context, train_s, a.steps / train_s, r.losses.front(),
      r.losses.back(), eval_before, eval_after);
  std::printf("sample: %s\n", sample.c_str());
  nlohmann::json j = {{"params", params},
                      {"steps", a.steps},
                      {"steps_per_s", a.steps / train_s},
                      {"loss_start", r.losses.front()},
                      {"loss_end", r.losses.back()},
                      {"eval_before", eval_before},
                      {"eval_after", eval_after},
                      {"threads", a.threads}};
  std::printf("%s\n", j.dump().c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace ts::worker

int main(int argc, char** argv) {
  CLI::App app{"trainshard worker maths"};
  app.require_subcommand(1);
  std::string out_dir;
  uint64_t seed = 1;
  uint32_t inner_steps = 1;
  int ref_threads = 2;
  CLI::App* ref = app.add_subcommand("reference", "write reference data for the Python check");
  ref->add_option("--out", out_dir, "output directory")->required();
  ref->add_option("--seed", seed, "initialization and batch seed");
  ref->add_option("--inner-steps", inner_steps, "inner AdamW steps")->check(CLI::Range(1, 100));
  ref->add_option("--threads", ref_threads, "torch threads")->check(CLI::Range(1, 256));
  std::string ref_family = "gpt";
  bool ref_tied = false;
  ref->add_option("--family", ref_family, "gpt | llama")->check(CLI::IsMember({"gpt", "llama"}));
  ref->add_flag("--tied", ref_tied, "llama: the head tied to the embedding");
  ts::worker::InnerOptions ref_inner;
  ref->add_option("--micro-batch", ref_inner.micro_batch, "rows per pass (0: the whole batch)");
  ref->add_option("--first-step", ref_inner.first_step, "global step of the first batch");
  ref->add_option("--warmup", ref_inner.schedule.warmup_steps, "warm-up steps");
  ref->add_option("--total", ref_inner.schedule.total_steps, "last step of the cosine (0: none)");
  ref->add_option("--min-lr-ratio", ref_inner.schedule.min_lr_ratio, "the cosine's floor");

  ts::worker::ThroughputArgs tp;
  CLI::App* thr = app.add_subcommand("throughput", "time training steps of a preset, print JSON");
  thr->add_option("--preset", tp.preset, "llama preset");
  thr->add_option("--vocab", tp.vocab);
  thr->add_option("--context", tp.context);
  thr->add_option("--batch", tp.batch)->check(CLI::Range(1, 4096));
  thr->add_option("--micro-batch", tp.micro_batch, "rows per pass (0: the whole batch)");
  thr->add_option("--steps", tp.steps, "timed steps")->check(CLI::Range(1, 100000));
  thr->add_option("--warmup", tp.warmup, "untimed steps first");
  thr->add_option("--threads", tp.threads)->check(CLI::Range(1, 256));
  thr->add_flag("--checkpointing", tp.checkpointing, "activation checkpointing");
  thr->add_option("--device", tp.device, "cpu | cuda | auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  thr->add_flag("--bf16", tp.bf16, "bf16 autocast with fp32 master weights (CUDA)");
  thr->add_flag("--probe-activations", tp.probe,
                "one forward and backward pass without the optimizer, for the peak memory");
  std::string mm_device = "cuda", mm_dtype = "bf16";
  int64_t mm_n = 8192;
  int mm_repeats = 10;
  CLI::App* mm = app.add_subcommand("matmul", "time a plain matrix product, print JSON");
  mm->add_option("--device", mm_device, "cpu | cuda | auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  mm->add_option("--dtype", mm_dtype, "bf16 | fp32")->check(CLI::IsMember({"bf16", "fp32"}));
  mm->add_option("--n", mm_n, "rows = columns = inner size")->check(CLI::Range(16, 65536));
  mm->add_option("--repeats", mm_repeats, "timed products")->check(CLI::Range(1, 1000));
  ts::worker::CheckpointArgs ck;
  CLI::App* ckpt = app.add_subcommand("checkpoint", "write a preset's checkpoint, print JSON");
  ckpt->add_option("--preset", ck.preset, "llama preset");
  ckpt->add_option("--vocab", ck.vocab);
  ckpt->add_option("--context", ck.context);
  ckpt->add_option("--out", ck.out, "file to create")->required();
  ts::worker::TrainArgs t;
  CLI::App* train = app.add_subcommand("train", "train on the real corpus and print figures");
  train->add_option("--steps", t.steps)->check(CLI::Range(1, 1000000));
  train->add_option("--batch", t.batch)->check(CLI::Range(1, 4096));
  train->add_option("--files", t.files, "fortune files to use (1..41)")->check(CLI::Range(1, 41));
  train->add_option("--layers", t.config.layers);
  train->add_option("--d-model", t.config.d_model);
  train->add_option("--heads", t.config.heads);
  train->add_option("--context", t.config.context);
  train->add_option("--vocab", t.config.vocab);
  train->add_option("--lr", t.lr);
  train->add_option("--threads", t.threads)->check(CLI::Range(1, 256));
  CLI11_PARSE(app, argc, argv);

  absl::Status s = mm->parsed()     ? ts::worker::MatmulPeak(mm_device, mm_dtype, mm_n, mm_repeats)
                   : ckpt->parsed() ? ts::worker::WriteCheckpoint(ck)
                   : thr->parsed()  ? ts::worker::Throughput(tp)
                   : ref->parsed()  ? ts::worker::Reference(out_dir, seed, inner_steps, ref_threads,
                                                            ref_family, ref_tied, ref_inner)
                                    : ts::worker::Train(t);
  if (!s.ok()) {
    std::fprintf(stderr, "ts_worker_tool: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
