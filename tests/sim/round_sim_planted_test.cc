// The simulation finds a bug planted in the round protocol: this binary links the shard library
// built with TS_PLANTED_BUG_QUORUM_AT_TWO_THIRDS, under which a round is planned and certified
// with exactly 2/3 of the shard's weight (the rule is more than 2/3). Within 100 seeds a seed
// must break the simulation's own count of a certificate's weight.
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "tests/sim/round_sim.h"

namespace ts::sim {
namespace {

TEST(RoundSimPlanted, CertifyingAtTwoThirdsIsFoundWithin100Seeds) {
  std::string found;
  for (uint64_t seed = 1; seed <= 100 && found.empty(); ++seed) {
    SimResult r = RunRoundSim({.seed = seed});
    if (!r.ok) found = r.violation;
  }
  ASSERT_FALSE(found.empty()) << "the planted bug went unnoticed for 100 seeds";
  std::printf("found: %s\n", found.c_str());
  EXPECT_NE(found.find("not more than 2/3"), std::string::npos) << found;
}

}  // namespace
}  // namespace ts::sim
