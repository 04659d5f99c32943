// The worker's training maths over the flat parameter vector: DiLoCo's inner loop (H AdamW steps
// on the host's assigned batches, returning the local parameters and the pseudo-gradient
// Δ = θ_base − θ_local), evaluation (mean cross-entropy on the held-out set) and sampling.
// The outer step is outer_step.h (plain C++, not libtorch). The API passes plain values only;
// libtorch stays inside trainer.cc and model.cc, and every c10::Error is caught there and
// returned as INTERNAL.
//
// Determinism: on CPU, the same parameters, batches, options and thread count give the same
// bytes (worker_test checks it through checkpoint roots). Different thread counts or a GPU may
// round differently inside libtorch; that is why the outer step, which every member must agree
// on bit for bit, is not done here.
//
// Thread-safety: torch::set_num_threads is process-wide, and a Trainer calls it with its
// options on each call; a process runs one Trainer call at a time. A Trainer has one owner.
#ifndef TS_WORKER_TRAINER_H_
#define TS_WORKER_TRAINER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data_shard.h"
#include "worker/device.h"
#include "worker/model_config.h"
#include "worker/tokenizer.h"
#include "worker/value_stream.h"

namespace ts::worker {

// What `device` resolves to on this machine: the first CUDA device with its name, memory and
// free memory (after this process's cached blocks are returned), or the CPU with the machine's
// memory and MemAvailable. FAILED_PRECONDITION for Device::kCuda where libtorch sees no CUDA
// device (a CPU-only libtorch, or no GPU visible).
absl::StatusOr<DeviceInfo> ProbeDevice(Device device);

// Whether this build's libtorch runs attention through fused kernels (libtorch 2's
// scaled_dot_product_attention), which keep no attention scores for the backward pass.
bool FusedAttention();

struct RuntimeOptions {
  int num_threads = 2;  // torch::set_num_threads, 1..256
  Device device = Device::kCpu;
};

// DiLoCo's inner optimizer. Weight decay applies to the matrices and embeddings (tensors of
// rank 2), not to biases and LayerNorm parameters. Gradients are clipped to a global L2 norm of
// grad_clip_norm before each step (<= 0: no clipping).
struct AdamWOptions {
  float lr = 6e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  float grad_clip_norm = 1.0f;
};

// The inner learning rate over the run's global inner steps (docs/worker.md "Training maths"):
// a linear warm-up over the first warmup_steps, then a cosine decay to min_lr_ratio · lr at
// total_steps (held there after); total_steps 0: constant after the warm-up. Keyed to the global
// step (round · H + step), so every host, and a host that rejoins, uses the same rate.
struct ScheduleOptions {
  uint64_t warmup_steps = 0;
  uint64_t total_steps = 0;
  float min_lr_ratio = 0.1f;  // 0..1
};

// The rate at global step `step` (0-based) for a peak of `lr`.
double ScheduledLr(double lr, const ScheduleOptions& schedule, uint64_t step);

// How one InnerSteps call runs, beside the optimizer's options.
struct InnerOptions {
  // Rows per forward and backward pass: a batch of more rows is split into micro-batches whose
  // gradients are accumulated (each weighted by its share of the rows) before the one optimizer
  // step. 0: the whole batch at once.
  uint32_t micro_batch = 0;
  uint64_t first_step = 0;  // the global step of the first batch
  ScheduleOptions schedule;
  // Keep only each layer's input during the forward pass and recompute the layer in the backward
  // pass: activation memory of one layer instead of all, for about a third more compute. The
  // same gradients bit for bit for a whole batch; with micro-batches, within rounding (a tied
  // embedding's two contributions are added to the accumulated gradient one after the other).
  bool activation_checkpointing = false;
  // bf16 autocast of the forward and backward passes, fp32 master weights and optimizer state.
  // CUDA only: on the CPU the worker trains in fp32 whatever this says (bf16 there is slow and
  // would make CPU hosts disagree with themselves across libtorch builds).
  bool bf16 = false;
};

struct InnerResult {
  std::vector<float> local_params;     // θ_local after the steps
  std::vector<float> pseudo_gradient;  // θ_base − θ_local, elementwise in fp32
  std::vector<float> losses;           // the training loss of each step, before its update
};

struct EvalOptions {
  uint32_t batch_size = 16;  // windows per forward pass
  uint64_t windows_max = 0;  // 0: every window of the eval set
  // The window to start from (modulo the set's windows); the windows wrap around to the first.
  uint64_t first_window = 0;
};

struct SampleOptions {
  float temperature = 1.0f;  // > 0
  uint32_t top_k = 0;        // 0: the whole vocabulary
  float top_p = 0;           // nucleus: 0 or 1: no cut, else the smallest set holding top_p
};

// Owns the model on its device and the inner AdamW state. The state (moments and step count)
// persists from one InnerSteps call to the next, as DiLoCo's workers keep it across rounds,
// until ResetOptimizer; the free InnerSteps below starts from fresh state every time.
class Trainer {
 public:
  // INVALID_ARGUMENT for a bad config or options (naming the field); FAILED_PRECONDITION for
  // Device::kCuda without CUDA.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const ModelConfig& config,
                                                         const AdamWOptions& adamw,
                                                         const RuntimeOptions& runtime);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Loads `base`, runs one AdamW step per batch (H = batches.size() >= 1) and returns the result.
  // INVALID_ARGUMENT for a base of the wrong length, an empty batch list, a batch whose width is
  // not 2..context + 1, a token >= vocab, or bad options (naming the field).
  absl::StatusOr<InnerResult> InnerSteps(std::span<const float> base,
                                         std::span<const TokenBatch> batches,
                                         const InnerOptions& options = {});
  void ResetOptimizer();

  // The streaming forms, for models too large to hold a second copy in memory (docs/worker.md
  // "Files at size"): the parameters go from a reader straight into the model's tensors and
  // out of them to a writer, a chunk at a time.
  //
  // Loads ParameterCount values (layout order) into the model; errors of the reader.
  absl::Status Load(ValueReader& params);
  // One AdamW step per batch from the loaded parameters, which stay in the model; each step's
  // loss. INVALID_ARGUMENT as InnerSteps.
  absl::StatusOr<std::vector<float>> Steps(std::span<const TokenBatch> batches,
                                           const InnerOptions& options = {});
  // Data parallel's two halves of a step, for training that averages gradients across workers
  // before one optimizer step shared by all (the data-parallel baseline of the DiLoCo papers:
  // docs/benchmarks.md, "The data-parallel baseline"). Gradient writes the gradient of `batch`'s
  // mean loss at the loaded parameters (layout order; micro-batches and checkpointing as in
  // Steps) and returns the loss; the parameters and the optimizer state do not change.
  // ApplyGradient reads ParameterCount values as the gradient, clips it by the optimizer's norm
  // and runs one AdamW step at the rate of global step options.first_step. INVALID_ARGUMENT as
  // InnerSteps, or for a gradient of the wrong length.
  absl::StatusOr<double> Gradient(const TokenBatch& batch, ValueWriter& out,
                                  const InnerOptions& options = {});
  absl::Status ApplyGradient(ValueReader& grad, const InnerOptions& options = {});
  // Writes Δ = base − θ elementwise in fp32, reading the base from `base`.
  absl::Status WritePseudoGradient(ValueReader& base, ValueWriter& out);
  // Writes the model's parameters (layout order).
  absl::Status WriteParams(ValueWriter& out);
  // Evaluate and Sample on the loaded parameters.
  absl::StatusOr<double> EvaluateLoaded(const DataShard& eval, const EvalOptions& options = {});
  // The mean loss of `batch` on the loaded parameters, without a gradient (as a step computes
  // it before its update, in one pass). INVALID_ARGUMENT as InnerSteps for a bad batch.
  absl::StatusOr<double> BatchLossLoaded(const TokenBatch& batch);
  absl::StatusOr<std::vector<uint32_t>> SampleLoaded(std::span<const uint32_t> prompt,
                                                     uint32_t count, uint64_t seed,
                                                     const SampleOptions& options = {});

  // Mean cross-entropy (nats per token) of `params` on the non-overlapping windows of
  // context + 1 tokens of `eval`. INVALID_ARGUMENT when eval holds fewer than 2 tokens, its vocab
  // is not the model's, or params has the wrong length.
  absl::StatusOr<double> Evaluate(std::span<const float> params, const DataShard& eval,
                                  const EvalOptions& options = {});

  // Continues `prompt` (at least one token) by `count` tokens, sampled with a generator seeded
  // from `seed`; the context window slides once it is full.
  absl::StatusOr<std::vector<uint32_t>> Sample(std::span<const float> params,
                                               std::span<const uint32_t> prompt, uint32_t count,
                                               uint64_t seed, const SampleOptions& options = {});

  // The parameters the model holds now, in ParameterLayout order.
  std::vector<float> Params() const;
  const ModelConfig& config() const;
  bool on_cuda() const;

 private:
  struct Impl;
  explicit Trainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One-shot inner steps with fresh AdamW state.
absl::StatusOr<InnerResult> InnerSteps(const ModelConfig& config, std::span<const float> base,
                                       std::span<const TokenBatch> batches,
                                       const AdamWOptions& adamw, const RuntimeOptions& runtime,
                                       const InnerOptions& options = {});

// Samples `count` tokens after the encoded `prompt` and returns prompt + continuation as text.
absl::StatusOr<std::string> SampleText(Trainer& trainer, std::span<const float> params,
                                       const Tokenizer& tokenizer, std::string_view prompt,
                                       uint32_t count, uint64_t seed,
                                       const SampleOptions& options = {});

}  // namespace ts::worker

#endif  // TS_WORKER_TRAINER_H_
