// Compiled with -ffp-contract=off (worker/CMakeLists.txt): each line below is one rounded fp32
// operation, whatever the compiler or target.
#include "worker/outer_step.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace ts::worker {

absl::Status OuterStep(std::span<float> params, std::span<float> momentum,
                       std::span<const float> delta, const OuterOptions& options) {
  if (params.size() != momentum.size() || params.size() != delta.size()) {
    return absl::InvalidArgumentError(absl::StrCat("outer step: params ", params.size(),
                                                   ", momentum ", momentum.size(), ", delta ",
                                                   delta.size(), " differ in length"));
  }
  if (!std::isfinite(options.lr) || options.lr < 0 || !std::isfinite(options.momentum) ||
      options.momentum < 0) {
    return absl::InvalidArgumentError(absl::StrCat("outer step: lr ", options.lr, " and momentum ",
                                                   options.momentum, " must be >= 0"));
  }
  for (size_t i = 0; i < delta.size(); ++i) {
    if (!std::isfinite(delta[i])) {
      return absl::InvalidArgumentError(absl::StrCat("outer step: delta[", i, "] is ", delta[i]));
    }
  }
  const float lr = options.lr;
  const float mu = options.momentum;
  for (size_t i = 0; i < params.size(); ++i) {
    const float g = delta[i];
    const float mu_m = mu * momentum[i];
    const float m = mu_m + g;
    momentum[i] = m;
    float d = m;
    if (options.nesterov) {
      const float mu_m2 = mu * m;
      d = g + mu_m2;
    }
    const float step = lr * d;
    params[i] = params[i] - step;
  }
  return absl::OkStatus();
}

}  // namespace ts::worker
