#include "worker/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#if defined(TS_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

#include "absl/strings/str_cat.h"
#include "common/process.h"
#include "common/status.h"
#include "worker/model.h"

namespace ts::worker {
namespace {

// Runs `fn`, turning a libtorch exception into INTERNAL: the library's boundary.
template <typename Fn>
auto Guard(absl::string_view what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(what, ": libtorch: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
}

absl::Status ValidateInnerOptions(const InnerOptions& o) {
  const ScheduleOptions& s = o.schedule;
  if (!(s.min_lr_ratio >= 0 && s.min_lr_ratio <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule.min_lr_ratio: ", s.min_lr_ratio, " is outside 0..1"));
  }
  if (s.total_steps != 0 && s.total_steps < s.warmup_steps) {
    return absl::InvalidArgumentError(absl::StrCat("schedule.total_steps: ", s.total_steps,
                                                   " is below warmup_steps ", s.warmup_steps));
  }
  return absl::OkStatus();
}

// bf16 autocast around the passes of one inner step, on CUDA only (InnerOptions.bf16).
class Bf16Autocast {
 public:
  explicit Bf16Autocast(bool on) : on_(on) {
    if (!on_) return;
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
#else
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
#endif
  }
  ~Bf16Autocast() {
    if (!on_) return;
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
    at::autocast::set_autocast_enabled(at::kCUDA, false);
#else
    at::autocast::set_enabled(false);
#endif
    at::autocast::clear_cache();
  }
  Bf16Autocast(const Bf16Autocast&) = delete;
  Bf16Autocast& operator=(const Bf16Autocast&) = delete;

 private:
  const bool on_;
};

absl::Status ValidateOptions(const AdamWOptions& a, const RuntimeOptions& r) {
  auto bad = [](absl::string_view field, double v) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", v, " is out of range"));
  };
  if (!(a.lr > 0) || !std::isfinite(a.lr)) return bad("adamw.lr", a.lr);
  if (!(a.beta1 >= 0 && a.beta1 < 1)) return bad("adamw.beta1", a.beta1);
  if (!(a.beta2 >= 0 && a.beta2 < 1)) return bad("adamw.beta2", a.beta2);
  if (!(a.eps > 0) || !std::isfinite(a.eps)) return bad("adamw.eps", a.eps);
  if (!(a.weight_decay >= 0) || !std::isfinite(a.weight_decay)) {
    return bad("adamw.weight_decay", a.weight_decay);
  }
  if (!std::isfinite(a.grad_clip_norm)) return bad("adamw.grad_clip_norm", a.grad_clip_norm);
  if (r.num_threads < 1 || r.num_threads > 256) return bad("runtime.num_threads", r.num_threads);
  return absl::OkStatus();
}

// AdamW with decoupled weight decay, computed op for op as libtorch's torch::optim::AdamW (and
// PyTorch's single-tensor AdamW) computes it, so the same bits, with one difference: the
// denominator sqrt(v̂) + eps is computed into the gradient's own buffer — which the step no longer
// needs — where those build two temporaries the size of the parameter. For the largest tensor
// (the token embedding: vocab × width) that is most of what a step holds beyond the training
// state (docs/worker.md "Training maths").
// A host buffer of kValueChunk floats through which a device's tensors are read and written a
// chunk at a time: page-locked for CUDA, so each copy is one DMA transfer.
torch::Tensor HostStaging(bool pinned) {
  return torch::empty({static_cast<int64_t>(kValueChunk)},
                      torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(pinned));
}

class AdamWInPlace {
 public:
  AdamWInPlace(const std::vector<torch::Tensor>& params, const AdamWOptions& o)
      : beta1_(o.beta1), beta2_(o.beta2), eps_(o.eps), lr_(o.lr) {
    for (const torch::Tensor& p : params) {
      // Matrices and embeddings decay; biases and norm weights do not.
      Slot& s = slots_.emplace_back();
      s.param = p;
      s.weight_decay = p.dim() >= 2 ? double{o.weight_decay} : 0.0;
    }
  }

  void set_lr(double lr) { lr_ = lr; }

  // The gradients dropped (PyTorch 2's default, set_to_none): the next backward pass then makes
  // each gradient as it computes it, where adding into zeroed buffers holds a gradient-sized
  // temporary per tensor on top of them (docs/benchmarks.md "Training throughput and memory":
  // 5.7 bytes per parameter less at the peak, for about 4 % of a step's time on the CPU).
  void zero_grad() {
    for (Slot& s : slots_) {
      s.param.mutable_grad() = torch::Tensor();
    }
  }

  void step() {
    torch::NoGradGuard no_grad;
#if defined(TS_WITH_CUDA) && defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
    if (!slots_.empty() && slots_[0].param.is_cuda()) {
      FusedStep();
      return;
    }
#endif
    for (Slot& s : slots_) {
      torch::Tensor& p = s.param;
      torch::Tensor& grad = p.mutable_grad();
      if (!grad.defined()) continue;
      if (s.weight_decay != 0) p.mul_(1 - lr_ * s.weight_decay);
      if (!s.exp_avg.defined()) {
        s.exp_avg = torch::zeros_like(p, torch::MemoryFormat::Preserve);
        s.exp_avg_sq = torch::zeros_like(p, torch::MemoryFormat::Preserve);
      }
      ++s.step;
      const double bias_correction1 = 1 - std::pow(beta1_, static_cast<double>(s.step));
      const double bias_correction2 = 1 - std::pow(beta2_, static_cast<double>(s.step));
      s.exp_avg.mul_(beta1_).add_(grad, 1 - beta1_);
      s.exp_avg_sq.mul_(beta2_).addcmul_(grad, grad, 1 - beta2_);
      torch::sqrt_out(grad, s.exp_avg_sq);  // the gradient's buffer becomes the denominator
      grad.div_(std::sqrt(bias_correction2)).add_(eps_);
      p.addcdiv_(s.exp_avg, grad, -(lr_ / bias_correction1));
    }
  }

 private:
  struct Slot {
    torch::Tensor param;
    double weight_decay = 0;
    torch::Tensor exp_avg;
    torch::Tensor exp_avg_sq;
    int64_t step = 0;
    torch::Tensor step_tensor;  // the fused kernel's step count, a float on the device
  };

#if defined(TS_WITH_CUDA) && defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
  // On CUDA: libtorch's fused AdamW kernel, one launch per weight-decay group, the same update
  // (decoupled decay, bias corrections) as the loop in step().
  void FusedStep() {
    for (const bool decays : {false, true}) {
      std::vector<torch::Tensor> params, grads, avgs, sqs, steps;
      double weight_decay = 0;
      for (Slot& s : slots_) {
        if ((s.weight_decay != 0) != decays || !s.param.mutable_grad().defined()) continue;
        if (!s.exp_avg.defined()) {
          s.exp_avg = torch::zeros_like(s.param, torch::MemoryFormat::Preserve);
          s.exp_avg_sq = torch::zeros_like(s.param, torch::MemoryFormat::Preserve);
          s.step_tensor = torch::zeros(
              {}, torch::TensorOptions().dtype(torch::kFloat32).device(s.param.device()));
        }
        ++s.step;
        weight_decay = s.weight_decay;
        params.push_back(s.param);
        grads.push_back(s.param.mutable_grad());
        avgs.push_back(s.exp_avg);
        sqs.push_back(s.exp_avg_sq);
        steps.push_back(s.step_tensor);
      }
      if (params.empty()) continue;
      at::_foreach_add_(steps, 1);
      at::_fused_adamw_(params, grads, avgs, sqs, /*max_exp_avg_sqs=*/{}, steps, lr_, beta1_,
                        beta2_, weight_decay, eps_, /*amsgrad=*/false, /*maximize=*/false);
    }
  }
#endif
  std::vector<Slot> slots_;
  double beta1_, beta2_, eps_, lr_;
};

}  // namespace

struct Trainer::Impl {
  ModelConfig config;
  AdamWOptions adamw;
  RuntimeOptions runtime;
  torch::Device device = torch::kCPU;
  std::shared_ptr<LanguageModel> model;
  std::vector<TensorSpec> layout;
  std::vector<torch::Tensor> params;  // layout order
  std::unique_ptr<AdamWInPlace> optimizer;

  void MakeOptimizer() { optimizer = std::make_unique<AdamWInPlace>(params, adamw); }

  absl::Status CheckLength(std::span<const float> flat) const {
    if (flat.size() != ParameterCount(config)) {
      return absl::InvalidArgumentError(absl::StrCat("params: ", flat.size(), " values, the model ",
                                                     ModelConfigString(config), " has ",
                                                     ParameterCount(config)));
    }
    return absl::OkStatus();
  }

  void Load(std::span<const float> flat) { TS_CHECK(LoadParams(*model, flat).ok()); }
  std::vector<float> Store() const { return StoreParams(*model); }

  // Checks and moves a batch to the device as [rows, cols] int64.
  absl::StatusOr<torch::Tensor> Tokens(const TokenBatch& b) const {
    if (b.rows == 0 || b.cols < 2 || b.cols > config.context + 1 ||
        b.tokens.size() != uint64_t{b.rows} * b.cols) {
      return absl::InvalidArgumentError(absl::StrCat("batch: ", b.rows, " x ", b.cols, " with ",
                                                     b.tokens.size(), " tokens for context ",
                                                     config.context));
    }
    for (size_t i = 0; i < b.tokens.size(); ++i) {
      if (b.tokens[i] < 0 || b.tokens[i] >= config.vocab) {
        return absl::InvalidArgumentError(absl::StrCat("batch: token[", i, "] = ", b.tokens[i],
                                                       " is outside the vocab of ", config.vocab));
      }
    }
    torch::Tensor t = torch::from_blob(const_cast<int64_t*>(b.tokens.data()),
                                       {int64_t{b.rows}, int64_t{b.cols}}, torch::kLong);
    return t.to(device, /*non_blocking=*/false, /*copy=*/true);
  }

  torch::Tensor LossOfLogits(const torch::Tensor& logits, const torch::Tensor& target) const {
    return torch::nn::functional::cross_entropy(
        logits.reshape({-1, int64_t{config.vocab}}).to(torch::kFloat32), target.reshape({-1}));
  }

  torch::Tensor Loss(const torch::Tensor& tokens) {
    const int64_t t = tokens.size(1) - 1;
    return LossOfLogits(model->Logits(tokens.slice(1, 0, t)), tokens.slice(1, 1, t + 1));
  }

  void SetLr(double lr) { optimizer->set_lr(lr); }

  // The gradient of `tokens`' mean loss added to the parameters' gradients, in micro-batches of
  // options.micro_batch rows each weighted by its share; the mean loss.
  double AccumulateGradient(const torch::Tensor& tokens, const InnerOptions& options) {
    const bool bf16 = options.bf16 && device.is_cuda();
    const int64_t rows = tokens.size(0);
    const int64_t micro =
        options.micro_batch == 0 ? rows : std::min<int64_t>(options.micro_batch, rows);
    double loss = 0;
    torch::Tensor on_device;  // CUDA: summed there, read once, so no pass waits for the host
    for (int64_t start = 0; start < rows; start += micro) {
      const int64_t end = std::min(rows, start + micro);
      const double share = static_cast<double>(end - start) / static_cast<double>(rows);
      Bf16Autocast autocast(bf16);
      const torch::Tensor pass =
          Backward(tokens.slice(0, start, end), share, options.activation_checkpointing);
      if (!device.is_cuda()) {
        loss += share * pass.item<double>();
      } else {
        const torch::Tensor part = pass.to(torch::kFloat64) * share;
        on_device = on_device.defined() ? on_device + part : part;
      }
    }
    return on_device.defined() ? on_device.item<double>() : loss;
  }

  // Scales the accumulated gradients to a global L2 norm of at most adamw.grad_clip_norm: on the
  // CPU through libtorch's clip_grad_norm_; on a device with the same maths kept there (the
  // coefficient clamped to 1 rather than read back to decide), so the step does not wait.
  void ClipGradients() {
    if (adamw.grad_clip_norm <= 0) return;
    if (!device.is_cuda()) {
      torch::nn::utils::clip_grad_norm_(params, adamw.grad_clip_norm);
      return;
    }
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> norms;
    for (torch::Tensor& p : params) {
      if (p.grad().defined()) norms.push_back(p.grad().norm(2));
    }
    if (norms.empty()) return;
    const torch::Tensor total = torch::stack(norms).norm(2);
    const torch::Tensor coef = (adamw.grad_clip_norm / (total + 1e-6)).clamp_max(1.0);
    for (torch::Tensor& p : params) {
      if (p.grad().defined()) p.mutable_grad().mul_(coef);
    }
  }

  // Clips the accumulated gradients, steps at the rate of global step `step` and drops them.
  void OptimizerStep(const InnerOptions& options, uint64_t step) {
    ClipGradients();
    SetLr(ScheduledLr(adamw.lr, options.schedule, step));
    optimizer->step();
    optimizer->zero_grad();
  }

  // The forward and backward passes of `tokens`, the gradients scaled by `scale` (its share of
  // the step's rows) and added to the parameters' gradients. Returns the (unscaled) mean loss, a
  // scalar tensor on the device.
  torch::Tensor Backward(const torch::Tensor& tokens, double scale, bool checkpointing) {
    const int64_t t = tokens.size(1) - 1;
    const torch::Tensor input = tokens.slice(1, 0, t), target = tokens.slice(1, 1, t + 1);
    if (!checkpointing) {
      torch::Tensor loss = LossOfLogits(model->Logits(input), target);
      (scale == 1.0 ? loss : loss * scale).backward();
      return loss.detach();
    }
    // Activation checkpointing: a forward pass that keeps only each layer's input, then the
    // backward pass stage by stage from the head down, each layer computed again from its input
    // with the gradient on, its output's gradient pushed through it.
    std::vector<torch::Tensor> inputs;
    torch::Tensor x;
    {
      torch::NoGradGuard no_grad;
      x = model->Embed(input);
      for (int64_t i = 0; i < int64_t{config.layers}; ++i) {
        inputs.push_back(x);
        x = model->Layer(i, x);
      }
    }
    torch::Tensor h = x.detach().requires_grad_(true);
    torch::Tensor loss = LossOfLogits(model->Head(h), target);
    (scale == 1.0 ? loss : loss * scale).backward();
    torch::Tensor grad = h.grad();
    for (int64_t i = int64_t{config.layers} - 1; i >= 0; --i) {
      torch::Tensor xi = inputs[static_cast<size_t>(i)].detach().requires_grad_(true);
      inputs[static_cast<size_t>(i)] = torch::Tensor();
      model->Layer(i, xi).backward(grad);
      grad = xi.grad();
    }
    model->Embed(input).backward(grad);
    return loss.detach();
  }
};

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

bool FusedAttention() {
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
  return true;
#else
  return false;
#endif
}

absl::StatusOr<DeviceInfo> ProbeDevice(Device device) {
  return Guard("device", [&]() -> absl::StatusOr<DeviceInfo> {
    const bool cuda = torch::cuda::is_available();
    if (device == Device::kCuda && !cuda) {
      return absl::FailedPreconditionError(
          "device: cuda requested, but libtorch sees no CUDA device (a CPU-only libtorch, or no "
          "GPU visible)");
    }
    DeviceInfo info;
    if (device != Device::kCpu && cuda) {
      info.device = Device::kCuda;
      info.name = "cuda";
#if defined(TS_WITH_CUDA)
      // Blocks this process's allocator keeps cached are free for the next model.
      c10::cuda::CUDACachingAllocator::emptyCache();
      info.name = at::cuda::getCurrentDeviceProperties()->name;
      size_t free = 0, total = 0;
      if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
        info.memory_bytes = total;
        info.free_bytes = free;
      }
#endif
      return info;
    }
    info.device = Device::kCpu;
    info.name = "cpu";
    info.memory_bytes = common::PhysicalMemoryBytes();
    info.free_bytes = common::AvailableMemoryBytes();
    return info;
  });
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const ModelConfig& config,
                                                         const AdamWOptions& adamw,
                                                         const RuntimeOptions& runtime) {
  TS_RETURN_IF_ERROR(ValidateModelConfig(config));
  TS_RETURN_IF_ERROR(ValidateOptions(adamw, runtime));
  return Guard("trainer", [&]() -> absl::StatusOr<std::unique_ptr<Trainer>> {
    auto impl = std::make_unique<Impl>();
    impl->config = config;
    impl->adamw = adamw;
    impl->runtime = runtime;
    const bool cuda = torch::cuda::is_available();
    if (runtime.device == Device::kCuda && !cuda) {
      return absl::FailedPreconditionError("trainer: CUDA requested but not available");
    }
    if (runtime.device != Device::kCpu && cuda) impl->device = torch::kCUDA;
    torch::set_num_threads(runtime.num_threads);
    impl->model = MakeModel(config);
    impl->model->to(impl->device);
    impl->layout = ParameterLayout(config);
    for (const auto& named : impl->model->named_parameters(/*recurse=*/true)) {
      impl->params.push_back(named.value());
    }
    impl->MakeOptimizer();
    return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
  });
}

void Trainer::ResetOptimizer() { impl_->MakeOptimizer(); }

double ScheduledLr(double lr, const ScheduleOptions& s, uint64_t step) {
  if (s.warmup_steps > 0 && step < s.warmup_steps) {
    return lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  }
  if (s.total_steps == 0) return lr;
  const uint64_t decay_steps = std::max<uint64_t>(1, s.total_steps - s.warmup_steps);
  const double progress =
      std::min(1.0, static_cast<double>(step - s.warmup_steps) / static_cast<double>(decay_steps));
  const double floor = s.min_lr_ratio;
  return lr * (floor + (1.0 - floor) * 0.5 * (1.0 + std::cos(M_PI * progress)));
}

absl::Status Trainer::Load(ValueReader& params) {
  Impl& m = *impl_;
  if (params.remaining() < ParameterCount(m.config)) {
    return absl::InvalidArgumentError(
        absl::StrCat("params: ", params.remaining(), " values, the model ",
                     ModelConfigString(m.config), " has ", ParameterCount(m.config)));
  }
  return Guard("load", [&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    torch::Tensor staging;  // a device's chunks pass through one host buffer (pinned on CUDA)
    for (torch::Tensor& p : m.params) {
      torch::Tensor flat = p.view({-1});
      const int64_t n = flat.numel();
      if (!m.device.is_cuda() && flat.is_contiguous()) {
        // Straight into the tensor's memory: no copy of the model in between.
        TS_RETURN_IF_ERROR(
            params.Read(std::span<float>(flat.data_ptr<float>(), static_cast<size_t>(n))));
        continue;
      }
      if (!staging.defined()) staging = HostStaging(m.device.is_cuda());
      for (int64_t start = 0; start < n; start += static_cast<int64_t>(kValueChunk)) {
        const int64_t take = std::min<int64_t>(kValueChunk, n - start);
        TS_RETURN_IF_ERROR(
            params.Read(std::span<float>(staging.data_ptr<float>(), static_cast<size_t>(take))));
        flat.slice(0, start, start + take).copy_(staging.slice(0, 0, take));
      }
    }
    return absl::OkStatus();
  });
}

namespace {

// Calls fn(values) for the model's parameters in layout order, a chunk at a time (the tensor's
// own memory on the CPU, a copy of a chunk from a device).
template <typename Fn>
absl::Status ForEachParamChunk(const std::vector<torch::Tensor>& params, Fn&& fn) {
  torch::NoGradGuard no_grad;
  torch::Tensor staging;
  for (const torch::Tensor& p : params) {
    const torch::Tensor flat = p.detach().view({-1});
    const int64_t n = flat.numel();
    if (flat.device().is_cpu() && flat.is_contiguous()) {
      TS_RETURN_IF_ERROR(
          fn(std::span<const float>(flat.data_ptr<float>(), static_cast<size_t>(n))));
      continue;
    }
    if (!staging.defined()) staging = HostStaging(flat.device().is_cuda());
    for (int64_t start = 0; start < n; start += static_cast<int64_t>(kValueChunk)) {
      const int64_t take = std::min<int64_t>(kValueChunk, n - start);
      staging.slice(0, 0, take).copy_(flat.slice(0, start, start + take));
      TS_RETURN_IF_ERROR(
          fn(std::span<const float>(staging.data_ptr<float>(), static_cast<size_t>(take))));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Trainer::WriteParams(ValueWriter& out) {
  return Guard("store", [&]() -> absl::Status {
    return ForEachParamChunk(impl_->params,
                             [&](std::span<const float> values) { return out.Write(values); });
  });
}

absl::Status Trainer::WritePseudoGradient(ValueReader& base, ValueWriter& out) {
  return Guard("pseudo-gradient", [&]() -> absl::Status {
    std::vector<float> delta;
    return ForEachParamChunk(impl_->params, [&](std::span<const float> local) -> absl::Status {
      // Within a tensor, in chunks of at most kValueChunk: Δ = base − θ, elementwise in fp32.
      for (size_t start = 0; start < local.size(); start += kValueChunk) {
        const size_t take = std::min<size_t>(kValueChunk, local.size() - start);
        delta.resize(take);
        TS_RETURN_IF_ERROR(base.Read(delta));
        for (size_t i = 0; i < take; ++i) delta[i] = delta[i] - local[start + i];
        TS_RETURN_IF_ERROR(out.Write(delta));
      }
      return absl::OkStatus();
    });
  });
}

absl::StatusOr<std::vector<float>> Trainer::Steps(std::span<const TokenBatch> batches,
                                                  const InnerOptions& options) {
  Impl& m = *impl_;
  if (batches.empty()) return absl::InvalidArgumentError("inner steps: no batches");
  TS_RETURN_IF_ERROR(ValidateInnerOptions(options));
  return Guard("inner steps", [&]() -> absl::StatusOr<std::vector<float>> {
    torch::set_num_threads(m.runtime.num_threads);
    m.model->train();
    std::vector<float> losses;
    losses.reserve(batches.size());
    for (size_t step = 0; step < batches.size(); ++step) {
      TS_ASSIGN_OR_RETURN(torch::Tensor tokens, m.Tokens(batches[step]));
      m.optimizer->zero_grad();
      const double loss = m.AccumulateGradient(tokens, options);
      m.OptimizerStep(options, options.first_step + step);
      losses.push_back(static_cast<float>(loss));
    }
    // The gradients are not needed between calls: their memory goes back now.
    for (torch::Tensor& p : m.params) p.mutable_grad() = torch::Tensor();
    return losses;
  });
}

absl::StatusOr<double> Trainer::Gradient(const TokenBatch& batch, ValueWriter& out,
                                         const InnerOptions& options) {
  Impl& m = *impl_;
  TS_RETURN_IF_ERROR(ValidateInnerOptions(options));
  return Guard("gradient", [&]() -> absl::StatusOr<double> {
    torch::set_num_threads(m.runtime.num_threads);
    m.model->train();
    TS_ASSIGN_OR_RETURN(torch::Tensor tokens, m.Tokens(batch));
    m.optimizer->zero_grad();
    const double loss = m.AccumulateGradient(tokens, options);
    std::vector<torch::Tensor> grads;
    for (torch::Tensor& p : m.params) {
      grads.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
    }
    m.optimizer->zero_grad();
    TS_RETURN_IF_ERROR(
        ForEachParamChunk(grads, [&](std::span<const float> values) { return out.Write(values); }));
    return loss;
  });
}

absl::Status Trainer::ApplyGradient(ValueReader& grad, const InnerOptions& options) {
  Impl& m = *impl_;
  TS_RETURN_IF_ERROR(ValidateInnerOptions(options));
  if (grad.remaining() != ParameterCount(m.config)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient: ", grad.remaining(), " values, the model ",
                     ModelConfigString(m.config), " has ", ParameterCount(m.config)));
  }
  return Guard("apply gradient", [&]() -> absl::Status {
    torch::set_num_threads(m.runtime.num_threads);
    for (torch::Tensor& p : m.params) {
      torch::Tensor g = torch::empty({p.numel()}, torch::kFloat32);
      TS_RETURN_IF_ERROR(
          grad.Read(std::span<float>(g.data_ptr<float>(), static_cast<size_t>(g.numel()))));
      p.mutable_grad() = g.view(p.sizes()).to(m.device);
    }
    m.OptimizerStep(options, options.first_step);
    return absl::OkStatus();
  });
}

absl::StatusOr<InnerResult> Trainer::InnerSteps(std::span<const float> base,
                                                std::span<const TokenBatch> batches,
                                                const InnerOptions& options) {
  Impl& m = *impl_;
  TS_RETURN_IF_ERROR(m.CheckLength(base));
  VectorReader reader(base);
  TS_RETURN_IF_ERROR(Load(reader));
  InnerResult result;
  TS_ASSIGN_OR_RETURN(result.losses, Steps(batches, options));
  VectorWriter local(&result.local_params);
  TS_RETURN_IF_ERROR(WriteParams(local));
  result.pseudo_gradient.resize(base.size());
  for (size_t i = 0; i < base.size(); ++i) {
    result.pseudo_gradient[i] = base[i] - result.local_params[i];
  }
  return result;
}

absl::StatusOr<double> Trainer::EvaluateLoaded(const DataShard& eval, const EvalOptions& options) {
  Impl& m = *impl_;
  if (eval.vocab != m.config.vocab) {
    return absl::InvalidArgumentError(absl::StrCat("evaluate: eval set vocab ", eval.vocab,
                                                   " is not the model's ", m.config.vocab));
  }
  if (eval.tokens.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("evaluate: eval set of ", eval.tokens.size(), " tokens"));
  }
  const uint32_t batch_size = std::max<uint32_t>(1, options.batch_size);
  return Guard("evaluate", [&]() -> absl::StatusOr<double> {
    torch::set_num_threads(m.runtime.num_threads);
    torch::NoGradGuard no_grad;
    m.model->eval();
    // Windows of context + 1 tokens starting every `context` tokens; the last may be shorter.
    const uint64_t n = eval.tokens.size(), step = m.config.context;
    std::vector<uint64_t> all;
    for (uint64_t s = 0; s + 1 < n; s += step) all.push_back(s);
    const uint64_t count =
        options.windows_max == 0 ? all.size() : std::min<uint64_t>(options.windows_max, all.size());
    std::vector<uint64_t> starts;
    for (uint64_t i = 0; i < count; ++i) {
      starts.push_back(all[(options.first_window % all.size() + i) % all.size()]);
    }
    auto width_at = [&](uint64_t s) { return std::min<uint64_t>(step + 1, n - s); };
    double nll_sum = 0;
    uint64_t predicted = 0;
    for (size_t i = 0; i < starts.size();) {
      TokenBatch b;  // equal-width windows only
      b.cols = static_cast<uint32_t>(width_at(starts[i]));
      while (i < starts.size() && b.rows < batch_size && width_at(starts[i]) == b.cols) {
        const auto from = eval.tokens.begin() + static_cast<int64_t>(starts[i]);
        b.tokens.insert(b.tokens.end(), from, from + b.cols);
        ++b.rows;
        ++i;
      }
      TS_ASSIGN_OR_RETURN(torch::Tensor tokens, m.Tokens(b));
      const uint64_t count = uint64_t{b.rows} * (b.cols - 1);
      nll_sum += m.Loss(tokens).item<double>() * static_cast<double>(count);
      predicted += count;
    }
    return nll_sum / static_cast<double>(predicted);
  });
}

absl::StatusOr<double> Trainer::BatchLossLoaded(const TokenBatch& batch) {
  Impl& m = *impl_;
  return Guard("batch loss", [&]() -> absl::StatusOr<double> {
    TS_ASSIGN_OR_RETURN(torch::Tensor tokens, m.Tokens(batch));
    torch::set_num_threads(m.runtime.num_threads);
    torch::NoGradGuard no_grad;
    m.model->eval();
    return m.Loss(tokens).item<double>();
  });
}

absl::StatusOr<double> Trainer::Evaluate(std::span<const float> params, const DataShard& eval,
                                         const EvalOptions& options) {
  TS_RETURN_IF_ERROR(impl_->CheckLength(params));
  VectorReader reader(params);
  TS_RETURN_IF_ERROR(Load(reader));
  return EvaluateLoaded(eval, options);
}

absl::StatusOr<std::vector<uint32_t>> Trainer::SampleLoaded(std::span<const uint32_t> prompt,
                                                            uint32_t count, uint64_t seed,
                                                            const SampleOptions& options) {
  Impl& m = *impl_;
  if (prompt.empty()) return absl::InvalidArgumentError("sample: empty prompt");
  if (!(options.temperature > 0) || !std::isfinite(options.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample: temperature ", options.temperature, " must be > 0"));
  }
  if (!(options.top_p >= 0 && options.top_p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample: top_p ", options.top_p, " is outside [0, 1]"));
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] >= m.config.vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample: prompt[", i, "] = ", prompt[i], " is outside the vocab"));
    }
  }
  return Guard("sample", [&]() -> absl::StatusOr<std::vector<uint32_t>> {
    torch::set_num_threads(m.runtime.num_threads);
    torch::NoGradGuard no_grad;
    m.model->eval();
    // Sampling runs on the CPU generator whatever the device, so a seed means the same draws.
    torch::Generator gen = at::detail::createCPUGenerator(seed);
    std::vector<int64_t> seq(prompt.begin(), prompt.end());
    std::vector<uint32_t> out;
    out.reserve(count);
    for (uint32_t i = 0; i < count; ++i) {
      const size_t window = std::min<size_t>(seq.size(), m.config.context);
      torch::Tensor input =
          torch::from_blob(seq.data() + (seq.size() - window), {1, int64_t(window)}, torch::kLong)
              .to(m.device, /*non_blocking=*/false, /*copy=*/true);
      torch::Tensor logits = m.model->Logits(input).select(1, int64_t(window) - 1).squeeze(0);
      logits = (logits / options.temperature).to(torch::kCPU, torch::kFloat64);
      if (options.top_k > 0 && options.top_k < m.config.vocab) {
        const torch::Tensor kth = std::get<0>(logits.topk(options.top_k)).select(0, -1);
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<double>::infinity());
      }
      if (options.top_p > 0 && options.top_p < 1) {
        // The most likely tokens until their mass reaches top_p: a token stays when the mass
        // before it (in descending order) is below top_p, so the most likely always does.
        auto [sorted, order] =
            torch::softmax(logits, /*dim=*/0).sort(/*dim=*/0, /*descending=*/true);
        const torch::Tensor cut_sorted = (sorted.cumsum(0) - sorted) >= double{options.top_p};
        const torch::Tensor cut = torch::zeros_like(cut_sorted).scatter(0, order, cut_sorted);
        logits = logits.masked_fill(cut, -std::numeric_limits<double>::infinity());
      }
      const torch::Tensor probs = torch::softmax(logits, /*dim=*/0);
      const int64_t next = torch::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
      seq.push_back(next);
      out.push_back(static_cast<uint32_t>(next));
    }
    return out;
  });
}

absl::StatusOr<std::vector<uint32_t>> Trainer::Sample(std::span<const float> params,
                                                      std::span<const uint32_t> prompt,
                                                      uint32_t count, uint64_t seed,
                                                      const SampleOptions& options) {
  TS_RETURN_IF_ERROR(impl_->CheckLength(params));
  VectorReader reader(params);
  TS_RETURN_IF_ERROR(Load(reader));
  return SampleLoaded(prompt, count, seed, options);
}

std::vector<float> Trainer::Params() const { return impl_->Store(); }
const ModelConfig& Trainer::config() const { return impl_->config; }
bool Trainer::on_cuda() const { return impl_->device.is_cuda(); }

absl::StatusOr<InnerResult> InnerSteps(const ModelConfig& config, std::span<const float> base,
                                       std::span<const TokenBatch> batches,
                                       const AdamWOptions& adamw, const RuntimeOptions& runtime,
                                       const InnerOptions& options) {
  TS_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(config, adamw, runtime));
  return trainer->InnerSteps(base, batches, options);
}

absl::StatusOr<std::string> SampleText(Trainer& trainer, std::span<const float> params,
                                       const Tokenizer& tokenizer, std::string_view prompt,
                                       uint32_t count, uint64_t seed,
                                       const SampleOptions& options) {
  TS_ASSIGN_OR_RETURN(std::vector<uint32_t> ids, tokenizer.Encode(prompt));
  if (ids.empty()) ids.push_back(tokenizer.eos_id());
  TS_ASSIGN_OR_RETURN(std::vector<uint32_t> more,
                      trainer.Sample(params, ids, count, seed, options));
  ids.insert(ids.end(), more.begin(), more.end());
  return tokenizer.Decode(ids);
}

}  // namespace ts::worker
