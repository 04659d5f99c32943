// The DiLoCo outer step: SGD with (Nesterov) momentum applied to the averaged pseudo-gradient,
// elementwise in plain C++ float arithmetic so the new parameters are bit-identical on every
// member, whatever its hardware or thread count. outer_step.cc is compiled with
// -ffp-contract=off (no fused multiply-add) and without -ffast-math; the order of operations per
// element is fixed (docs/worker.md "Determinism"). Same maths as torch.optim.SGD(momentum,
// nesterov, dampening=0, weight_decay=0) with the pseudo-gradient as the gradient:
//   m ← μ·m + Δ;   d ← Δ + μ·m (Nesterov) or d ← m;   θ ← θ − lr·d.
//
// Thread-safety: pure function over caller-owned buffers.
#ifndef TS_WORKER_OUTER_STEP_H_
#define TS_WORKER_OUTER_STEP_H_

#include <span>

#include "absl/status/status.h"

namespace ts::worker {

struct OuterOptions {
  float lr = 0.7f;
  float momentum = 0.9f;
  bool nesterov = true;
};

// INVALID_ARGUMENT (nothing changed) when the three lengths differ, lr or momentum is negative
// or not finite, or delta holds a non-finite value (naming its index).
absl::Status OuterStep(std::span<float> params, std::span<float> momentum,
                       std::span<const float> delta, const OuterOptions& options);

}  // namespace ts::worker

#endif  // TS_WORKER_OUTER_STEP_H_
