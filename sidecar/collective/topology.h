// Ring order from measured link rates: a ring is as fast as its slowest link, so the order
// chosen maximizes the minimum rate over the ring's links (then, among equals, their sum).
// Every member must apply the same choice to the same measurements: the function is
// deterministic and ties keep the earlier order.
//
// Thread-safety: pure function.
#ifndef TS_SIDECAR_COLLECTIVE_TOPOLOGY_H_
#define TS_SIDECAR_COLLECTIVE_TOPOLOGY_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"

namespace ts::sidecar {

// rates[i][j]: bytes/s measured from member i to member j (the diagonal is ignored; 0 means
// unreachable). Returns a permutation of 0..n−1 starting with 0: the ring visits members in
// that order. Exhaustive for n ≤ 9. Above that: the best greedy tour, improved by local search
// (segment reversals and relocations, bounded sweeps), then a branch-and-bound search for a
// better slowest link (bounded steps: exact when it finishes, as it does on random rates up to
// about 16 members; a good ring otherwise), then local search again for the total rate.
// INVALID_ARGUMENT when the matrix is not n×n (n ≥ 2), holds a negative or non-finite rate, or
// n > 256.
absl::StatusOr<std::vector<size_t>> ChooseRingOrder(const std::vector<std::vector<double>>& rates);

// The slowest link's rate of the ring `order` over `rates` (0 for fewer than two members). Every
// member of `order` must index the square matrix `rates` (a programmer error otherwise: checked).
double RingBottleneck(const std::vector<std::vector<double>>& rates,
                      const std::vector<size_t>& order);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_COLLECTIVE_TOPOLOGY_H_
