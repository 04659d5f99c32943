// SettlementFromMembers against real SettlementQuery servers on loopback: the settlement members
// holding more than 2/3 of the weight signed is taken; a member answering with another's
// signature, another chain's or shard's settlement, or not at all counts for nothing, and
// without the 2/3 nothing is taken; members that never answer are waited for together.
#include "sidecar/cli/member_settlement.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/signing.h"
#include "common/protocol.h"
#include "gonka/trainshard/v1/host.grpc.pb.h"
#include "gtest/gtest.h"
#include "proto/deterministic.h"
#include "tests/util/loopback_server.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;

constexpr char kChain[] = "member-settlement-1";
constexpr uint64_t kShard = 7;

common::PrivateKey Key(int i) {
  return *common::PrivateKey::FromBytes(common::Sha256("member " + std::to_string(i)));
}
std::string Addr(int i) { return common::AddressFromPublicKey(Key(i).public_key()); }

pb::Settlement Draft(char root_byte, const std::string& chain = kChain, uint64_t shard = kShard) {
  pb::Settlement s;
  s.set_chain_id(chain);
  s.set_shard_id(shard);
  s.set_final_checkpoint_root(std::string(32, root_byte));
  s.set_rounds_completed(3);
  return s;
}

// Answers one fixed response, as a member's host does from its records.
class FixedSettlement final : public pb::SettlementQuery::Service {
 public:
  explicit FixedSettlement(pb::GetSettlementResponse answer) : answer_(std::move(answer)) {}
  grpc::Status GetSettlement(grpc::ServerContext*, const pb::GetSettlementRequest*,
                             pb::GetSettlementResponse* out) override {
    *out = answer_;
    return grpc::Status::OK;
  }

 private:
  pb::GetSettlementResponse answer_;
};

// Holds every call until the caller gives up, as a member that accepts and never answers.
class HangingSettlement final : public pb::SettlementQuery::Service {
 public:
  grpc::Status GetSettlement(grpc::ServerContext* context, const pb::GetSettlementRequest*,
                             pb::GetSettlementResponse*) override {
    while (!context->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return grpc::Status::CANCELLED;
  }
};

class MemberSettlementTest : public ::testing::Test {
 protected:
  // Member `who` serves `draft` signed by `signer`'s key; returns it as a SettlementMember.
  SettlementMember Serve(int who, uint64_t weight, const pb::Settlement& draft, int signer) {
    pb::GetSettlementResponse answer;
    *answer.mutable_settlement() = draft;
    answer.mutable_signature()->set_host(Addr(who));
    answer.mutable_signature()->set_signature(
        *common::SignStatement(Key(signer), protocol::kSignSettlement, draft.chain_id(),
                               draft.shard_id(), DeterministicBytes(draft)));
    return Listen(who, weight, std::make_unique<FixedSettlement>(answer));
  }

  // Member `who` accepts the call and never answers.
  SettlementMember Hang(int who, uint64_t weight) {
    return Listen(who, weight, std::make_unique<HangingSettlement>());
  }

  // Starts `service` on a loopback port as member `who`'s endpoint.
  SettlementMember Listen(int who, uint64_t weight,
                          std::unique_ptr<pb::SettlementQuery::Service> service) {
    services_.push_back(std::move(service));
    servers_.push_back(test_util::StartLoopbackServer({services_.back().get()}));
    return {Addr(who), servers_.back().endpoint, "", weight};
  }

  ~MemberSettlementTest() override {
    for (auto& s : servers_) s.server->Shutdown();
  }

  std::vector<std::unique_ptr<pb::SettlementQuery::Service>> services_;
  std::vector<test_util::LoopbackServer> servers_;
};

TEST_F(MemberSettlementTest, TakesWhatMoreThanTwoThirdsOfTheWeightSigned) {
  std::vector<SettlementMember> members = {Serve(1, 50, Draft('a'), 1), Serve(2, 30, Draft('a'), 2),
                                           Serve(3, 20, Draft('b'), 3)};
  auto s = SettlementFromMembers(members, kChain, kShard, 5000);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->final_checkpoint_root(), std::string(32, 'a'));
}

TEST_F(MemberSettlementTest, AnAnswerCountsOnlyForItsOwnSigner) {
  // Member 2 relays a settlement member 3 signed, as its own: not counted, so 'a' has 60 of 100.
  std::vector<SettlementMember> members = {Serve(1, 40, Draft('a'), 1), Serve(2, 40, Draft('a'), 3),
                                           Serve(3, 20, Draft('a'), 3)};
  auto s = SettlementFromMembers(members, kChain, kShard, 5000);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << s.status();
  EXPECT_NE(s.status().message().find("did not sign"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("at most 60 agree"), std::string::npos) << s.status();
}

TEST_F(MemberSettlementTest, OtherChainsShardsAndSilentMembersCountForNothing) {
  std::vector<SettlementMember> members = {Serve(1, 40, Draft('a'), 1),
                                           Serve(2, 30, Draft('a', "another-chain"), 2),
                                           Serve(3, 20, Draft('a', kChain, kShard + 1), 3),
                                           // Nothing listens there.
                                           SettlementMember{Addr(4), "127.0.0.1:1", "", 10}};
  auto s = SettlementFromMembers(members, kChain, kShard, 2000);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << s.status();
  for (const std::string& part : {std::string("another-chain"), std::string("shard 8"), Addr(4)}) {
    EXPECT_NE(s.status().message().find(part), std::string::npos) << part << ": " << s.status();
  }
  // A silent member's weight still counts in the total: 50 of 60 is enough, 40 of 60 is not.
  members = {members[0], Serve(5, 10, Draft('a'), 5), members[3]};
  EXPECT_TRUE(SettlementFromMembers(members, kChain, kShard, 2000).ok());
  members[1].weight = 0;
  members[0].weight = 40;
  members[2].weight = 20;
  EXPECT_EQ(SettlementFromMembers(members, kChain, kShard, 2000).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(SettlementFromMembers({}, kChain, kShard, 2000).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(MemberSettlementTest, MembersThatNeverAnswerCostOneTimeoutTogether) {
  // Four members hold the call open; the other three hold 3/4 of the weight. Asked one after
  // another the four would cost four timeouts; asked together, about one.
  std::vector<SettlementMember> members = {Serve(1, 40, Draft('a'), 1), Serve(2, 40, Draft('a'), 2),
                                           Serve(3, 40, Draft('a'), 3)};
  for (int i = 4; i < 8; ++i) members.push_back(Hang(i, 10));
  const auto start = std::chrono::steady_clock::now();
  auto s = SettlementFromMembers(members, kChain, kShard, 1000);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->final_checkpoint_root(), std::string(32, 'a'));
  EXPECT_LT(seconds, 3.0);
}

}  // namespace
}  // namespace ts::sidecar
