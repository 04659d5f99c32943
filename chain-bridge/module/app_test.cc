#include "chain-bridge/module/app.h"

#include "chain-bridge/module/chain_test_util.h"

namespace ts::bridge::chain_test {
namespace {

// ---------------------------------------------------------------------------------------------
// Genesis

TEST_F(ChainTest, GenesisStateAndAccountNumbers) {
  EXPECT_EQ(app_->height(), 0);
  EXPECT_EQ(app_->app_hash(), std::string(32, '\0'));
  EXPECT_EQ(app_->TotalSupply(), 10'000'000u + 5000 + 1000 + 1000 + 5 * 1000);
  EXPECT_EQ(app_->Balance(Addr(creator_)), 10'000'000u);
  // Account numbers in genesis order, then the module accounts.
  EXPECT_EQ(app_->Account(Addr(creator_))->first, 0u);
  EXPECT_EQ(app_->Account(Addr(hosts_[4]))->first, 8u);
  EXPECT_EQ(app_->Account(app_->GovAddress())->first, 9u);
  EXPECT_EQ(app_->Account(app_->EscrowAddress())->first, 10u);
  EXPECT_EQ(app_->GovAddress(), common::ModuleAddress("gov"));
  EXPECT_EQ(app_->EscrowAddress(), common::ModuleAddress("trainshard"));
  auto weights = app_->GetWeights(0);
  ASSERT_TRUE(weights.ok());
  EXPECT_EQ(weights->total_weight(), 450u);
  EXPECT_EQ(weights->weights_size(), 5);
  EXPECT_EQ(app_->CurrentEpoch(), 0u);
  EXPECT_EQ(app_->GetWeights(1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(app_->Account(Addr(Key("nobody"))).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(app_->AccountPublicKey(Addr(creator_)), "");
}

TEST_F(ChainTest, BadGenesisIsRefusedNamingTheField) {
  pb::Genesis bad = genesis_;
  bad.mutable_params()->set_quorum_ppm(2'000'000);
  auto app = App::InitChain(bad);
  EXPECT_EQ(app.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(app.status().message()), HasSubstr("params.quorum_ppm"));

  bad = genesis_;
  bad.mutable_accounts(1)->set_address(bad.accounts(0).address());
  app = App::InitChain(bad);
  EXPECT_THAT(std::string(app.status().message()), HasSubstr("appears twice"));

  bad = genesis_;
  bad.mutable_accounts(0)->set_balance("-5");
  app = App::InitChain(bad);
  EXPECT_THAT(std::string(app.status().message()), HasSubstr("accounts[0].balance"));

  bad = genesis_;
  bad.mutable_poc_weights(0)->set_weight(0);
  app = App::InitChain(bad);
  EXPECT_THAT(std::string(app.status().message()), HasSubstr("poc_weights[0].weight"));

  bad = genesis_;
  bad.mutable_params()->set_poc_authority("not-an-address");
  app = App::InitChain(bad);
  EXPECT_THAT(std::string(app.status().message()), HasSubstr("params.poc_authority"));

  bad = genesis_;
  bad.mutable_accounts(0)->set_address(common::ModuleAddress("trainshard"));
  app = App::InitChain(bad);
  EXPECT_THAT(std::string(app.status().message()), HasSubstr("module account"));
}

// ---------------------------------------------------------------------------------------------
// Happy path

TEST_F(ChainTest, ProposalVotesOpenReserveRunSettle) {
  const uint64_t supply = app_->TotalSupply();
  const uint64_t creator_start = app_->Balance(Addr(creator_));

  TxResponse submitted = Deliver(creator_, {ProposalMsg(creator_, {DefaultSpec()})});
  auto proposed = EventsOf(submitted.events(), "trainshard.shard_proposed");
  ASSERT_EQ(proposed.size(), 1u);
  EXPECT_EQ(proposed[0]["shard_id"], "1");
  EXPECT_EQ(proposed[0]["proposal_id"], "1");
  EXPECT_EQ(proposed[0]["creator"], Addr(creator_));
  EXPECT_EQ(proposed[0]["hardware_profile"], "cpu-small");
  EXPECT_EQ(proposed[0]["max_nodes"], "3");
  EXPECT_EQ(proposed[0]["escrow"], "900000");
  auto proposal = app_->GetProposal(1);
  ASSERT_TRUE(proposal.ok());
  EXPECT_EQ(proposal->status(), pb::PROPOSAL_STATUS_VOTING_PERIOD);
  EXPECT_EQ(proposal->voting_end_height(), 1 + 3);
  EXPECT_EQ(proposal->total_weight(), 450u);
  EXPECT_EQ(proposal->weight_epoch(), 0u);
  EXPECT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_PROPOSED);
  EXPECT_EQ(app_->Balance(app_->GovAddress()), 1000u);

  TxResponse vote = Deliver(hosts_[0], {VoteMsg(hosts_[0], 1, cosmos::gov::v1::VOTE_OPTION_YES)});
  auto vote_events = EventsOf(vote.events(), "gov.vote");
  ASSERT_EQ(vote_events.size(), 1u);
  EXPECT_EQ(vote_events[0]["option"], "yes");
  EXPECT_EQ(vote_events[0]["weight"], "100");
  Deliver(hosts_[1], {VoteMsg(hosts_[1], 1, cosmos::gov::v1::VOTE_OPTION_YES)});
  BlockOutcome end = Block();  // height 4 = voting_end_height
  ASSERT_EQ(app_->height(), 4);
  auto finalized = EventsOf(end.results.end_block_events(), "gov.proposal_finalized");
  ASSERT_EQ(finalized.size(), 1u);
  EXPECT_EQ(finalized[0]["status"], "passed");
  EXPECT_EQ(finalized[0]["yes"], "200");
  EXPECT_EQ(finalized[0]["no"], "0");
  auto opened = EventsOf(end.results.end_block_events(), "trainshard.shard_opened");
  ASSERT_EQ(opened.size(), 1u);
  EXPECT_EQ(opened[0]["reservation_deadline_height"], "14");
  EXPECT_EQ(opened[0]["deadline_height"], "44");
  EXPECT_EQ(opened[0]["min_host_weight"], "60");
  EXPECT_EQ(app_->GetProposal(1)->status(), pb::PROPOSAL_STATUS_PASSED);
  auto shard = app_->GetShard(1);
  EXPECT_EQ(shard->status(), pb::SHARD_STATUS_OPEN);
  EXPECT_EQ(shard->escrow_held(), "900000");
  EXPECT_EQ(shard->open_height(), 4);
  EXPECT_EQ(app_->Balance(app_->EscrowAddress()), 900000u);
  EXPECT_EQ(app_->Balance(app_->GovAddress()), 0u);
  EXPECT_EQ(app_->Balance(Addr(creator_)), creator_start - 900000);

  // Three reservations; the third fills the shard, which runs.
  for (int i = 0; i < 3; ++i) {
    const auto& host = hosts_[static_cast<size_t>(i)];
    TxResponse reserved = Deliver(host, {ReserveMsg(SignedReservation(host, 1))});
    auto added = EventsOf(reserved.events(), "trainshard.reservation_added");
    ASSERT_EQ(added.size(), 1u);
    EXPECT_EQ(added[0]["host"], Addr(host));
    EXPECT_EQ(added[0]["frozen_weight"], "100");
    EXPECT_EQ(added[0]["members"], std::to_string(i + 1));
    EXPECT_EQ(added[0]["endpoint"], "127.0.0.1:7101");
    auto running = EventsOf(reserved.events(), "trainshard.shard_running");
    EXPECT_EQ(running.size(), i == 2 ? 1u : 0u);
    if (i == 2) {
      EXPECT_EQ(running[0]["total_weight"], "300");
    }
  }
  shard = app_->GetShard(1);
  EXPECT_EQ(shard->status(), pb::SHARD_STATUS_RUNNING);
  EXPECT_EQ(shard->total_weight(), 300u);
  ASSERT_EQ(shard->reservations_size(), 3);
  EXPECT_EQ(shard->reservations(0).frozen_weight(), 100u);
  EXPECT_GT(shard->reservations(0).reserved_height(), 4);
  EXPECT_EQ(app_->AccountPublicKey(Addr(hosts_[0])), hosts_[0].public_key());

  // Settlement signed by all three members, submitted by the creator.
  pb::Settlement s = MakeSettlement(1);
  TxResponse settled =
      Deliver(creator_, {SettleMsg(creator_, s,
                                   {SignSettlement(hosts_[0], s), SignSettlement(hosts_[1], s),
                                    SignSettlement(hosts_[2], s)})});
  auto settled_events = EventsOf(settled.events(), "trainshard.shard_settled");
  ASSERT_EQ(settled_events.size(), 1u);
  EXPECT_EQ(settled_events[0]["final_checkpoint_root"],
            common::HexEncode(common::Sha256("final checkpoint")));
  EXPECT_EQ(settled_events[0]["signed_weight"], "300");
  EXPECT_EQ(settled_events[0]["total_weight"], "300");
  EXPECT_EQ(settled_events[0]["refund"], "1");
  EXPECT_EQ(EventsOf(settled.events(), "trainshard.payout").size(), 3u);
  shard = app_->GetShard(1);
  EXPECT_EQ(shard->status(), pb::SHARD_STATUS_SETTLED);
  EXPECT_EQ(shard->close_reason(), pb::CLOSE_REASON_SETTLED);
  EXPECT_EQ(shard->escrow_held(), "0");
  EXPECT_EQ(app_->Balance(Addr(hosts_[0])), 1000u + 385714);
  EXPECT_EQ(app_->Balance(Addr(hosts_[2])), 1000u + 128571);
  EXPECT_EQ(app_->Balance(Addr(creator_)), creator_start - 899999);
  EXPECT_EQ(app_->Balance(app_->EscrowAddress()), 0u);
  EXPECT_EQ(app_->TotalSupply(), supply);
  auto record = app_->GetSettlement(1);
  ASSERT_TRUE(record.ok());
  EXPECT_EQ(record->signed_weight(), 300u);
  EXPECT_EQ(record->submitter(), Addr(creator_));
  EXPECT_EQ(record->signatures_size(), 3);
  EXPECT_EQ(app_->ListShards(pb::SHARD_STATUS_SETTLED, 0, 10).size(), 1u);

  // Settling again is refused: the shard is already settled.
  ExpectRefused(creator_, {SettleMsg(creator_, s, {SignSettlement(hosts_[0], s)})}, kAlreadyExists,
                "shard 1 is already settled");
  // Deadline passes without effect on a settled shard.
  AdvanceTo(45);
  EXPECT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_SETTLED);
}

// A wallet that signs only in amino JSON (a Ledger) proposes a shard and a host reserves a
// place in it: both land as their direct-signed twins do; a tampered amino signature does not.
TEST_F(ChainTest, AminoSignedProposalAndReservationLand) {
  using cosmos::tx::signing::v1beta1::SIGN_MODE_LEGACY_AMINO_JSON;
  auto amino = [&](const common::PrivateKey& key, const std::vector<google::protobuf::Any>& msgs) {
    auto account = app_->Account(Addr(key));
    EXPECT_TRUE(account.ok()) << account.status();
    return BuildSignedTx(key, kChainId, account->first, account->second, msgs, TestFee(), "",
                         SIGN_MODE_LEGACY_AMINO_JSON);
  };
  std::string proposal = amino(creator_, {ProposalMsg(creator_, {DefaultSpec()})});
  ASSERT_EQ(app_->CheckTx(proposal).code(), kOk) << app_->CheckTx(proposal).raw_log();
  // The same tx with one byte of its signature changed is refused, and changes nothing.
  std::string forged = proposal;
  forged[forged.size() - 5] ^= 0x01;
  EXPECT_NE(app_->CheckTx(forged).code(), kOk);
  BlockOutcome outcome = Block({proposal});
  ASSERT_EQ(outcome.results.tx_results(0).code(), kOk) << outcome.results.tx_results(0).raw_log();
  auto submitted = EventsOf(outcome.results.tx_results(0).events(), "gov.proposal_submitted");
  ASSERT_EQ(submitted.size(), 1u);
  const uint64_t proposal_id = std::stoull(submitted[0]["proposal_id"]);
  std::vector<std::string> votes;
  for (int i = 0; i < 3; ++i) {
    const auto& host = hosts_[static_cast<size_t>(i)];
    votes.push_back(amino(host, {VoteMsg(host, proposal_id, cosmos::gov::v1::VOTE_OPTION_YES)}));
  }
  Block(votes);
  for (const auto& result : last_.results.tx_results()) EXPECT_EQ(result.code(), kOk);
  AdvanceTo(std::stoll(submitted[0]["voting_end_height"]));
  const uint64_t shard_id = app_->GetProposal(proposal_id)->shard_id();
  ASSERT_EQ(app_->GetShard(shard_id)->status(), pb::SHARD_STATUS_OPEN);
  std::string reserve = amino(hosts_[0], {ReserveMsg(SignedReservation(hosts_[0], shard_id))});
  Block({reserve});
  EXPECT_EQ(last_.results.tx_results(0).code(), kOk) << last_.results.tx_results(0).raw_log();
  EXPECT_EQ(app_->GetShard(shard_id)->reservations_size(), 1);
}

TEST_F(ChainTest, ReservationRefusals) {
  pb::ShardSpec spec = DefaultSpec();
  spec.set_reservation_window_blocks(30);  // room for every refusal below, one block each
  uint64_t shard = OpenShard(spec);
  // Below the weight floor (host 5 holds 50 < 60), and no weight at all.
  ExpectRefused(hosts_[4], {ReserveMsg(SignedReservation(hosts_[4], shard))}, kFailedPrecondition,
                "weight 50 below the floor 60");
  ExpectRefused(outsider_, {ReserveMsg(SignedReservation(outsider_, shard))}, kFailedPrecondition,
                "weight 0 below the floor 60");
  // A signature by another key, a signature for another shard, for another chain.
  pb::Reservation forged = SignedReservation(hosts_[0], shard);
  forged.set_signature(SignedReservation(hosts_[1], shard).signature());
  ExpectRefused(hosts_[0], {ReserveMsg(forged)}, kUnauthenticated,
                "reservation.signature: does not verify for host " + Addr(hosts_[0]));
  pb::Reservation tampered = SignedReservation(hosts_[0], shard);
  tampered.set_endpoint("10.0.0.1:9999");
  ExpectRefused(hosts_[0], {ReserveMsg(tampered)}, kUnauthenticated, "does not verify");
  pb::Reservation other_chain = SignedReservation(hosts_[0], shard, "trainshard-other-2");
  ExpectRefused(hosts_[0], {ReserveMsg(other_chain)}, kUnauthenticated, "does not verify");
  pb::Reservation short_sig = SignedReservation(hosts_[0], shard);
  short_sig.set_signature("x");
  ExpectRefused(hosts_[0], {ReserveMsg(short_sig)}, kUnauthenticated, "1 bytes, want 65");
  // Field checks.
  pb::Reservation r = SignedReservation(hosts_[0], shard);
  r.set_endpoint("no-port");
  ExpectRefused(hosts_[0], {ReserveMsg(r)}, kInvalidArgument,
                "reservation.endpoint: 'no-port' is not host:port");
  r = SignedReservation(hosts_[0], shard);
  r.set_tls_cert_sha256("abc");
  ExpectRefused(hosts_[0], {ReserveMsg(r)}, kInvalidArgument,
                "reservation.tls_cert_sha256: 3 bytes, want 32");
  r = SignedReservation(hosts_[0], shard);
  r.set_frozen_weight(1000);
  ExpectRefused(hosts_[0], {ReserveMsg(r)}, kInvalidArgument, "reservation.frozen_weight: 1000");
  r = SignedReservation(hosts_[0], shard);
  r.set_valid_until_height(1);
  ExpectRefused(hosts_[0], {ReserveMsg(r)}, kFailedPrecondition,
                "reservation.valid_until_height: 1 is before height");
  ExpectRefused(hosts_[0], {ReserveMsg(SignedReservation(hosts_[0], 77))}, kNotFound,
                "shard 77 not found");
  // Twice by the same host.
  Deliver(hosts_[0], {ReserveMsg(SignedReservation(hosts_[0], shard))});
  ExpectRefused(hosts_[0], {ReserveMsg(SignedReservation(hosts_[0], shard))}, kAlreadyExists,
                "already holds a place in shard " + std::to_string(shard));
  // Beyond max nodes.
  Deliver(hosts_[1], {ReserveMsg(SignedReservation(hosts_[1], shard))});
  Deliver(hosts_[2], {ReserveMsg(SignedReservation(hosts_[2], shard))});
  ASSERT_EQ(app_->GetShard(shard)->status(), pb::SHARD_STATUS_RUNNING);
  ExpectRefused(hosts_[3], {ReserveMsg(SignedReservation(hosts_[3], shard))}, kResourceExhausted,
                "shard " + std::to_string(shard) + " is full: max_nodes 3");
  // A reservation whose host is not the tx signer is refused before execution.
  ExpectRefusedTx(SignTx(hosts_[3], {ReserveMsg(SignedReservation(hosts_[0], shard))}),
                  Addr(hosts_[3]), Sdk(SdkCode::kUnauthorized), "is not the tx signer",
                  /*bumps_sequence=*/false);
}

TEST_F(ChainTest, ReservationWindowAndAssembly) {
  pb::ShardSpec spec = DefaultSpec();
  spec.set_max_nodes(4);
  uint64_t shard = OpenShard(spec);
  int64_t window_end = app_->GetShard(shard)->reservation_deadline_height();
  // Two reservations (min_nodes 2), the second in the last block of the window.
  Deliver(hosts_[0], {ReserveMsg(SignedReservation(hosts_[0], shard))});
  AdvanceTo(window_end - 1);
  Deliver(hosts_[1], {ReserveMsg(SignedReservation(hosts_[1], shard))});
  ASSERT_EQ(app_->height(), window_end);
  auto running = EventsOf(last_.results.end_block_events(), "trainshard.shard_running");
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0]["members"], "2");
  EXPECT_EQ(app_->GetShard(shard)->status(), pb::SHARD_STATUS_RUNNING);
  // After the window a host is refused.
  ExpectRefused(hosts_[2], {ReserveMsg(SignedReservation(hosts_[2], shard))}, kFailedPrecondition,
                "is running, not open");

  // Assembly before the window ends, by a member; refused below min_nodes and for strangers.
  uint64_t second = OpenShard(spec);
  pb::MsgAssembleTrainshard assemble;
  assemble.set_creator(Addr(hosts_[0]));
  assemble.set_shard_id(second);
  Deliver(hosts_[0], {ReserveMsg(SignedReservation(hosts_[0], second))});
  ExpectRefused(hosts_[0], {PackMsg(assemble)}, kFailedPrecondition,
                "has 1 members, below min_nodes 2");
  Deliver(hosts_[1], {ReserveMsg(SignedReservation(hosts_[1], second))});
  pb::MsgAssembleTrainshard stranger = assemble;
  stranger.set_creator(Addr(outsider_));
  ExpectRefused(outsider_, {PackMsg(stranger)}, kPermissionDenied,
                "is neither the creator nor a member");
  TxResponse assembled = Deliver(hosts_[0], {PackMsg(assemble)});
  EXPECT_EQ(EventsOf(assembled.events(), "trainshard.shard_running").size(), 1u);
  EXPECT_EQ(app_->GetShard(second)->status(), pb::SHARD_STATUS_RUNNING);
  ExpectRefused(hosts_[0], {PackMsg(assemble)}, kFailedPrecondition, "is running, not open");
}

TEST_F(ChainTest, ShardWithoutEnoughNodesExpiresAndRefunds) {
  uint64_t shard = OpenShard(DefaultSpec());
  Deliver(hosts_[0], {ReserveMsg(SignedReservation(hosts_[0], shard))});
  uint64_t creator_before = app_->Balance(Addr(creator_));
  AdvanceTo(app_->GetShard(shard)->reservation_deadline_height());
  auto expired = EventsOf(last_.results.end_block_events(), "trainshard.shard_expired");
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0]["reason"], "not_enough_nodes");
  EXPECT_EQ(expired[0]["refund"], "900000");
  auto record = app_->GetShard(shard);
  EXPECT_EQ(record->status(), pb::SHARD_STATUS_EXPIRED);
  EXPECT_EQ(record->close_reason(), pb::CLOSE_REASON_NOT_ENOUGH_NODES);
  EXPECT_EQ(record->escrow_held(), "0");
  EXPECT_EQ(app_->Balance(Addr(creator_)), creator_before + 900000);
  // Nothing more happens at the old deadline.
  AdvanceTo(record->deadline_height());
  EXPECT_TRUE(EventsOf(last_.results.end_block_events(), "trainshard.shard_expired").empty());
}

TEST_F(ChainTest, OpenShardWhoseWindowEndsAtItsDeadlineExpiresOnce) {
  // Window == duration: at the deadline an OPEN shard without min_nodes expires once.
  pb::ShardSpec spec = DefaultSpec();
  spec.set_max_duration_blocks(5);
  spec.set_reservation_window_blocks(5);
  uint64_t shard = OpenShard(spec);
  AdvanceTo(app_->GetShard(shard)->deadline_height());
  auto expired = EventsOf(last_.results.end_block_events(), "trainshard.shard_expired");
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0]["reason"], "not_enough_nodes");
}

TEST_F(ChainTest, ShardKeepsItsRunSpecAndReaders) {
  pb::ShardSpec spec = DefaultSpec();
  spec.set_run_spec(R"({"model": {"family": "llama", "preset": "tiny"}})");
  spec.set_run_spec_hash(common::Sha256(spec.run_spec()));
  spec.add_readers(Addr(Key("reader-a")));
  spec.add_readers(Addr(Key("reader-b")));
  uint64_t shard = OpenShard(spec);
  auto record = app_->GetShard(shard);
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->spec().run_spec(), spec.run_spec());
  EXPECT_EQ(record->spec().run_spec_hash(), spec.run_spec_hash());
  ASSERT_EQ(record->spec().readers_size(), 2);
  EXPECT_EQ(record->spec().readers(1), Addr(Key("reader-b")));
}

// ---------------------------------------------------------------------------------------------
// Governance

TEST_F(ChainTest, MalformedSpecsAreRefusedNamingTheField) {
  struct Case {
    std::function<void(pb::ShardSpec*)> mutate;
    std::string fragment;
  };
  std::vector<Case> cases = {
      {[](pb::ShardSpec* s) { s->set_min_nodes(0); }, "spec.min_nodes: 0 is below 1"},
      {[](pb::ShardSpec* s) { s->set_max_nodes(1); }, "spec.max_nodes: 1 is below min_nodes 2"},
      {[](pb::ShardSpec* s) { s->set_max_nodes(17); },
       "spec.max_nodes: 17 exceeds max_nodes_limit 16"},
      {[](pb::ShardSpec* s) { s->set_run_spec_hash("abc"); },
       "spec.run_spec_hash: 3 bytes, want 32"},
      {[](pb::ShardSpec* s) { s->set_hardware_profile("GPU_big"); },
       "spec.hardware_profile: 'GPU_big' does not match [a-z0-9-]{1,64}"},
      {[](pb::ShardSpec* s) { s->set_max_duration_blocks(0); },
       "spec.max_duration_blocks: 0 is outside 1..1000"},
      {[](pb::ShardSpec* s) { s->set_reservation_window_blocks(41); },
       "spec.reservation_window_blocks: 41 is outside 1..max_duration_blocks 40"},
      {[](pb::ShardSpec* s) { s->mutable_escrow()->set_denom("uatom"); },
       "spec.escrow.denom: 'uatom' is not ngonka"},
      {[](pb::ShardSpec* s) { s->mutable_escrow()->set_amount("0"); },
       "spec.escrow.amount: 0 must be positive"},
      {[](pb::ShardSpec* s) { s->mutable_artifact_quota()->set_files_max(0); },
       "spec.artifact_quota.files_max: 0 must be positive"},
      {[](pb::ShardSpec* s) {
         s->mutable_reward_policy()->set_kind(pb::RewardPolicy::KIND_UNSPECIFIED);
       },
       "spec.reward_policy.kind: 0 is not a specified kind"},
      {[](pb::ShardSpec* s) { s->mutable_reward_policy()->set_max_host_share_bps(3000); },
       "spec.reward_policy.max_host_share_bps: 3000 times max_nodes 3 is below 10000"},
      {[](pb::ShardSpec* s) { s->mutable_reward_policy()->set_max_host_share_bps(10001); },
       "spec.reward_policy.max_host_share_bps: 10001 is outside 1..10000"},
      {[](pb::ShardSpec* s) { s->set_run_spec("another run spec"); },
       "spec.run_spec: its SHA-256 is not spec.run_spec_hash"},
      {[](pb::ShardSpec* s) {
         s->set_run_spec(std::string(kRunSpecBytesMax + 1, 'x'));
         s->set_run_spec_hash(common::Sha256(s->run_spec()));
       },
       "spec.run_spec: 65537 bytes is more than 65536"},
      {[](pb::ShardSpec* s) { s->add_readers("cosmos1qqqq"); }, "spec.readers[0]"},
      {[](pb::ShardSpec* s) {
         for (size_t i = 0; i <= kReadersMax; ++i)
           s->add_readers(Addr(Key(absl::StrCat("reader-", i))));
       },
       "spec.readers: 17 addresses is more than 16"},
      {[](pb::ShardSpec* s) {
         std::string reader = Addr(Key("reader"));
         s->add_readers(reader);
         s->add_readers(reader);
       },
       "spec.readers[1]: gonka1"},
  };
  for (const auto& c : cases) {
    pb::ShardSpec spec = DefaultSpec();
    c.mutate(&spec);
    SCOPED_TRACE(c.fragment);
    ExpectRefused(creator_, {ProposalMsg(creator_, {spec})}, kInvalidArgument,
                  "messages[0]: " + c.fragment);
  }
  ExpectRefused(creator_, {ProposalMsg(creator_, {DefaultSpec()}, "999")}, kInvalidArgument,
                "initial_deposit: 999 is below min_deposit 1000");
  ExpectRefused(creator_, {ProposalMsg(creator_, {})}, kInvalidArgument,
                "messages: 0 messages, want 1..4");
  ExpectRefused(creator_,
                {ProposalMsg(creator_, {DefaultSpec(), DefaultSpec(), DefaultSpec(), DefaultSpec(),
                                        DefaultSpec()})},
                kInvalidArgument, "messages: 5 messages, want 1..4");
  // A proposal message that is not a shard creation, and one with the wrong authority.
  cosmos::gov::v1::MsgSubmitProposal wrong;
  wrong.set_proposer(Addr(creator_));
  *wrong.add_messages() = SendMsg(creator_, Addr(hosts_[0]), "1");
  auto* coin = wrong.add_initial_deposit();
  coin->set_denom("ngonka");
  coin->set_amount("1000");
  ExpectRefused(creator_, {PackMsg(wrong)}, kInvalidArgument, "messages[0].type_url");
  pb::MsgCreateTrainshardProposal create;
  create.set_authority(Addr(creator_));
  create.set_creator(Addr(creator_));
  *create.mutable_spec() = DefaultSpec();
  wrong.clear_messages();
  *wrong.add_messages() = PackMsg(create);
  ExpectRefused(creator_, {PackMsg(wrong)}, kInvalidArgument, "is not the gov account");
  // Shard creation outside a proposal.
  ExpectRefusedTx(SignTx(creator_, {PackMsg(create)}), Addr(creator_), Sdk(SdkCode::kTxDecode),
                  "executed by governance only", /*bumps_sequence=*/false);
}

TEST_F(ChainTest, TallyQuorumFailureRefundsDeposit) {
  uint64_t creator_before = app_->Balance(Addr(creator_));
  Deliver(creator_, {ProposalMsg(creator_, {DefaultSpec()})});
  Deliver(hosts_[0], {VoteMsg(hosts_[0], 1, cosmos::gov::v1::VOTE_OPTION_YES)});  // 100 of 450
  AdvanceTo(app_->GetProposal(1)->voting_end_height());
  auto finalized = EventsOf(last_.results.end_block_events(), "gov.proposal_finalized");
  ASSERT_EQ(finalized.size(), 1u);
  EXPECT_EQ(finalized[0]["status"], "rejected");
  EXPECT_EQ(finalized[0]["reason"], "quorum_not_reached");
  EXPECT_EQ(app_->GetProposal(1)->status(), pb::PROPOSAL_STATUS_REJECTED);
  EXPECT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_REJECTED);
  EXPECT_EQ(app_->GetShard(1)->close_reason(), pb::CLOSE_REASON_REJECTED);
  auto rejected = EventsOf(last_.results.end_block_events(), "trainshard.shard_rejected");
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_EQ(rejected[0]["reason"], "proposal_rejected");
  EXPECT_EQ(app_->Balance(Addr(creator_)), creator_before);
  EXPECT_EQ(app_->Balance(app_->GovAddress()), 0u);
}

TEST_F(ChainTest, TallyVetoSendsDepositToCommunityPool) {
  uint64_t creator_before = app_->Balance(Addr(creator_));
  Deliver(creator_, {ProposalMsg(creator_, {DefaultSpec()})});
  Block({SignTx(hosts_[0], {VoteMsg(hosts_[0], 1, cosmos::gov::v1::VOTE_OPTION_YES)}),
         SignTx(hosts_[1], {VoteMsg(hosts_[1], 1, cosmos::gov::v1::VOTE_OPTION_NO_WITH_VETO)}),
         SignTx(hosts_[2], {VoteMsg(hosts_[2], 1, cosmos::gov::v1::VOTE_OPTION_YES)})});
  // Veto 100 of 300 voted (333333 ppm) would not pass the 334000 veto threshold; a deposit
  // top-up and a fourth vote (veto) in one tx make it 200 of 400.
  cosmos::gov::v1::MsgDeposit deposit;
  deposit.set_proposal_id(1);
  deposit.set_depositor(Addr(hosts_[3]));
  auto* coin = deposit.add_amount();
  coin->set_denom("ngonka");
  coin->set_amount("500");
  Deliver(hosts_[3],
          {PackMsg(deposit), VoteMsg(hosts_[3], 1, cosmos::gov::v1::VOTE_OPTION_NO_WITH_VETO)});
  EXPECT_EQ(app_->GetProposal(1)->deposit(), "1500");
  EXPECT_EQ(app_->Balance(app_->GovAddress()), 1500u);
  AdvanceTo(app_->GetProposal(1)->voting_end_height());
  auto finalized = EventsOf(last_.results.end_block_events(), "gov.proposal_finalized");
  ASSERT_EQ(finalized.size(), 1u);
  EXPECT_EQ(finalized[0]["status"], "rejected");
  EXPECT_EQ(finalized[0]["reason"], "vetoed");
  EXPECT_EQ(finalized[0]["no_with_veto"], "200");
  EXPECT_EQ(app_->Balance(common::ModuleAddress("distribution")), 1500u);
  EXPECT_EQ(app_->Balance(Addr(creator_)), creator_before - 1000);
  EXPECT_EQ(app_->Balance(Addr(hosts_[3])), 500u);
}

TEST_F(ChainTest, TallyRejectAndRevote) {
  Deliver(creator_, {ProposalMsg(creator_, {DefaultSpec()})});
  // Host 1 first votes yes, then changes to no: only the last vote counts.
  Block({SignTx(hosts_[0], {VoteMsg(hosts_[0], 1, cosmos::gov::v1::VOTE_OPTION_YES)}),
         SignTx(hosts_[1], {VoteMsg(hosts_[1], 1, cosmos::gov::v1::VOTE_OPTION_YES)}),
         SignTx(hosts_[2], {VoteMsg(hosts_[2], 1, cosmos::gov::v1::VOTE_OPTION_NO)}),
         SignTx(hosts_[3], {VoteMsg(hosts_[3], 1, cosmos::gov::v1::VOTE_OPTION_ABSTAIN)})});
  Deliver(hosts_[0], {VoteMsg(hosts_[0], 1, cosmos::gov::v1::VOTE_OPTION_NO)});
  AdvanceTo(app_->GetProposal(1)->voting_end_height());
  auto finalized = EventsOf(last_.results.end_block_events(), "gov.proposal_finalized");
  ASSERT_EQ(finalized.size(), 1u);
  EXPECT_EQ(finalized[0]["yes"], "100");
  EXPECT_EQ(finalized[0]["no"], "200");
  EXPECT_EQ(finalized[0]["abstain"], "100");
  EXPECT_EQ(finalized[0]["reason"], "threshold_not_reached");
  auto proposal = app_->GetProposal(1);
  EXPECT_EQ(proposal->status(), pb::PROPOSAL_STATUS_REJECTED);
  EXPECT_EQ(proposal->final_tally().no(), 200u);
  // Voting after the end, and with no weight, are refused.
  ExpectRefused(hosts_[0], {VoteMsg(hosts_[0], 1, cosmos::gov::v1::VOTE_OPTION_YES)},
                kFailedPrecondition, "proposal 1 is not in its voting period");
  ExpectRefused(hosts_[0], {VoteMsg(hosts_[0], 7, cosmos::gov::v1::VOTE_OPTION_YES)}, kNotFound,
                "proposal 7 not found");
  // Two refusals inside the next proposal's voting period (its end block tallies it).
  Deliver(creator_, {ProposalMsg(creator_, {DefaultSpec()})});
  ExpectRefused(outsider_, {VoteMsg(outsider_, 2, cosmos::gov::v1::VOTE_OPTION_YES)},
                kPermissionDenied, "has no weight in epoch 0");
  ExpectRefused(hosts_[0], {VoteMsg(hosts_[0], 2, cosmos::gov::v1::VoteOption(9))},
                kInvalidArgument, "option: 9");
}

TEST_F(ChainTest, PassedProposalWhoseCreatorCannotPayFails) {
  uint64_t proposal_id = PassProposal({DefaultSpec()}, &poor_);
  auto proposal = app_->GetProposal(proposal_id);
  EXPECT_EQ(proposal->status(), pb::PROPOSAL_STATUS_FAILED);
  EXPECT_THAT(proposal->failed_reason(), HasSubstr("insufficient funds"));
  auto finalized = EventsOf(last_.results.end_block_events(), "gov.proposal_finalized");
  ASSERT_EQ(finalized.size(), 1u);
  EXPECT_EQ(finalized[0]["status"], "failed");
  auto shard = app_->GetShard(proposal->shard_id());
  EXPECT_EQ(shard->status(), pb::SHARD_STATUS_REJECTED);
  EXPECT_EQ(shard->close_reason(), pb::CLOSE_REASON_ESCROW_UNFUNDED);
  EXPECT_TRUE(EventsOf(last_.results.end_block_events(), "trainshard.shard_opened").empty());
  EXPECT_EQ(app_->Balance(Addr(poor_)), 5000u);  // deposit refunded, nothing escrowed
}

// ---------------------------------------------------------------------------------------------
// PoC weights

TEST_F(ChainTest, WeightSubmissionAndEpochInForce) {
  auto weights_msg = [&](const common::PrivateKey& signer, uint64_t epoch,
                         std::vector<std::pair<std::string, uint64_t>> entries) {
    pb::MsgSubmitPocWeights msg;
    msg.set_authority(Addr(signer));
    msg.set_epoch(epoch);
    for (const auto& [host, weight] : entries) {
      auto* w = msg.add_weights();
      w->set_host(host);
      w->set_weight(weight);
    }
    return PackMsg(msg);
  };
  ExpectRefused(hosts_[0], {weights_msg(hosts_[0], 1, {{Addr(hosts_[0]), 1000}})},
                kPermissionDenied, "unauthorised");
  ExpectRefused(authority_, {weights_msg(authority_, 0, {{Addr(hosts_[0]), 1000}})},
                kFailedPrecondition, "epoch: 0 is not after the latest recorded epoch 0");
  ExpectRefused(authority_, {weights_msg(authority_, 2, {{Addr(hosts_[0]), 1000}})},
                kFailedPrecondition, "epoch: 2 is more than one epoch ahead of chain epoch 0");
  ExpectRefused(authority_, {weights_msg(authority_, 1, {})}, kInvalidArgument, "weights: empty");
  ExpectRefused(authority_,
                {weights_msg(authority_, 1, {{Addr(hosts_[0]), 5}, {Addr(hosts_[0]), 6}})},
                kInvalidArgument, "weights[1].host");
  ExpectRefused(authority_, {weights_msg(authority_, 1, {{Addr(hosts_[0]), 0}})}, kInvalidArgument,
                "weights[0].weight: 0 must be positive");
  ExpectRefused(authority_, {weights_msg(authority_, 1, {{"gonka1bad", 5}})}, kInvalidArgument,
                "weights[0].host");

  // A proposal under epoch 0, then epoch 1 weights recorded ahead of time.
  Deliver(creator_, {ProposalMsg(creator_, {DefaultSpec()})});
  TxResponse submitted = Deliver(
      authority_,
      {weights_msg(authority_, 1,
                   {{Addr(hosts_[1]), 100}, {Addr(hosts_[4]), 500}, {Addr(outsider_), 300}})});
  auto event = EventsOf(submitted.events(), "poc.weights_submitted");
  ASSERT_EQ(event.size(), 1u);
  EXPECT_EQ(event[0]["epoch"], "1");
  EXPECT_EQ(event[0]["hosts"], "3");
  EXPECT_EQ(event[0]["total_weight"], "900");
  EXPECT_EQ(app_->CurrentEpoch(), 0u);  // height < 10: epoch 0 is still in force
  auto epoch1 = app_->GetWeights(1);
  ASSERT_TRUE(epoch1.ok());
  EXPECT_EQ(epoch1->total_weight(), 900u);
  EXPECT_EQ(epoch1->weights_size(), 3);
  // The outsider has weight only from epoch 1 on; the proposal counts epoch 0.
  ExpectRefused(outsider_, {VoteMsg(outsider_, 1, cosmos::gov::v1::VOTE_OPTION_YES)},
                kPermissionDenied, "no weight in epoch 0");
  ASSERT_EQ(app_->height(), 10);
  EXPECT_EQ(app_->CurrentEpoch(), 1u);

  // A proposal in epoch 1 counts epoch 1's weights: host 5 and the outsider carry it.
  TxResponse second = Deliver(creator_, {ProposalMsg(creator_, {DefaultSpec()})});
  uint64_t proposal_id =
      std::stoull(EventsOf(second.events(), "gov.proposal_submitted")[0]["proposal_id"]);
  EXPECT_EQ(app_->GetProposal(proposal_id)->weight_epoch(), 1u);
  EXPECT_EQ(app_->GetProposal(proposal_id)->total_weight(), 900u);
  ExpectRefused(hosts_[0], {VoteMsg(hosts_[0], proposal_id, cosmos::gov::v1::VOTE_OPTION_YES)},
                kPermissionDenied, "has no weight in epoch 1");
  Block({SignTx(hosts_[4], {VoteMsg(hosts_[4], proposal_id, cosmos::gov::v1::VOTE_OPTION_YES)}),
         SignTx(outsider_, {VoteMsg(outsider_, proposal_id, cosmos::gov::v1::VOTE_OPTION_YES)})});
  AdvanceTo(app_->GetProposal(proposal_id)->voting_end_height());
  ASSERT_EQ(app_->GetProposal(proposal_id)->status(), pb::PROPOSAL_STATUS_PASSED);
  uint64_t shard = app_->GetProposal(proposal_id)->shard_id();
  // Host 1 holds no weight in epoch 1; host 5 now holds 500 and reserves with it.
  ExpectRefused(hosts_[0], {ReserveMsg(SignedReservation(hosts_[0], shard))}, kFailedPrecondition,
                "weight 0 below the floor 60 (epoch 1)");
  TxResponse reserved = Deliver(hosts_[4], {ReserveMsg(SignedReservation(hosts_[4], shard))});
  EXPECT_EQ(EventsOf(reserved.events(), "trainshard.reservation_added")[0]["frozen_weight"], "500");
  // Epoch 2 may be recorded once the chain is in epoch 1, not epoch 3.
  ExpectRefused(authority_, {weights_msg(authority_, 3, {{Addr(hosts_[0]), 1}})},
                kFailedPrecondition, "epoch: 3 is more than one epoch ahead of chain epoch 1");
  Deliver(authority_, {weights_msg(authority_, 2, {{Addr(hosts_[0]), 7}})});
  EXPECT_EQ(app_->CurrentEpoch(), 1u);
  AdvanceTo(20);
  EXPECT_EQ(app_->CurrentEpoch(), 2u);
  EXPECT_EQ(app_->GetWeights(2)->total_weight(), 7u);
}

// ---------------------------------------------------------------------------------------------
// Ante: tx-level refusals leave the state untouched

TEST_F(ChainTest, TxLevelRefusals) {
  google::protobuf::Any send = SendMsg(creator_, Addr(hosts_[0]), "10");
  // A bad signature.
  std::string tx = SignTx(creator_, {send});
  cosmos::tx::v1beta1::TxRaw raw;
  ASSERT_TRUE(raw.ParseFromString(tx));
  std::string sig = raw.signatures(0);
  sig[5] ^= 0x40;
  raw.set_signatures(0, sig);
  ExpectRefusedTx(DeterministicBytes(raw), Addr(creator_), Sdk(SdkCode::kUnauthorized),
                  "signature verification failed", /*bumps_sequence=*/false);
  // Signed for another chain.
  ExpectRefusedTx(SignTx(creator_, {send}, 0, "trainshard-other-2"), Addr(creator_),
                  Sdk(SdkCode::kUnauthorized), "signature verification failed",
                  /*bumps_sequence=*/false);
  // A wrong sequence.
  ExpectRefusedTx(SignTx(creator_, {send}, 1), Addr(creator_), Sdk(SdkCode::kWrongSequence),
                  "account sequence mismatch, expected 0, got 1", /*bumps_sequence=*/false);
  // A replayed tx.
  std::string once = SignTx(creator_, {send});
  ASSERT_EQ(app_->CheckTx(once).code(), kOk);
  Block({once});
  ASSERT_EQ(last_.results.tx_results(0).code(), kOk);
  ExpectRefusedTx(once, Addr(creator_), Sdk(SdkCode::kWrongSequence),
                  "account sequence mismatch, expected 1, got 0", /*bumps_sequence=*/false);
  // Oversize and garbage bytes.
  ExpectRefusedTx(std::string(kMaxTxBytes + 1, 'x'), "", Sdk(SdkCode::kTxTooLarge),
                  "exceeds the cap of 1048576 bytes", /*bumps_sequence=*/false);
  ExpectRefusedTx("\xff\xff\xff garbage", "", Sdk(SdkCode::kTxDecode), "not a valid",
                  /*bumps_sequence=*/false);
  ExpectRefusedTx("", "", Sdk(SdkCode::kTxDecode), "tx: empty", /*bumps_sequence=*/false);
  // An unknown account.
  common::PrivateKey stranger = Key("stranger");
  ExpectRefusedTx(
      BuildSignedTx(stranger, kChainId, 0, 0, {SendMsg(stranger, Addr(creator_), "1")}, TestFee()),
      Addr(stranger), Sdk(SdkCode::kUnknownAddress), "not found", /*bumps_sequence=*/false);
  // An unknown message type.
  google::protobuf::Any unknown;
  unknown.set_type_url("/cosmos.staking.v1beta1.MsgDelegate");
  ExpectRefusedTx(SignTx(creator_, {unknown}), Addr(creator_), Sdk(SdkCode::kTxDecode),
                  "is not a message this chain accepts", /*bumps_sequence=*/false);
  // A message with an unknown field appended.
  google::protobuf::Any extra = SendMsg(creator_, Addr(hosts_[0]), "10");
  extra.mutable_value()->append("\xa0\x06\x01");  // field 100, varint 1
  ExpectRefusedTx(SignTx(creator_, {extra}), Addr(creator_), Sdk(SdkCode::kTxDecode),
                  "unknown field 100",
                  /*bumps_sequence=*/false);
}

TEST_F(ChainTest, TransfersCreateAccountsAndFailuresOnlyBumpTheSequence) {
  common::PrivateKey fresh = Key("fresh");
  TxResponse sent = Deliver(creator_, {SendMsg(creator_, Addr(fresh), "5000")});
  // The bank's events as the SDK emits them, after the message event and marked with its index.
  auto transfer = EventsOf(sent.events(), "transfer");
  ASSERT_EQ(transfer.size(), 1u);
  EXPECT_EQ(transfer[0]["sender"], Addr(creator_));
  EXPECT_EQ(transfer[0]["recipient"], Addr(fresh));
  EXPECT_EQ(transfer[0]["amount"], "5000ngonka");
  EXPECT_EQ(transfer[0]["msg_index"], "0");
  auto spent = EventsOf(sent.events(), "coin_spent");
  ASSERT_EQ(spent.size(), 1u);
  EXPECT_EQ(spent[0]["spender"], Addr(creator_));
  EXPECT_EQ(spent[0]["amount"], "5000ngonka");
  auto received = EventsOf(sent.events(), "coin_received");
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0]["receiver"], Addr(fresh));
  auto message = EventsOf(sent.events(), "message");
  ASSERT_EQ(message.size(), 1u);
  EXPECT_EQ(message[0]["action"], "/cosmos.bank.v1beta1.MsgSend");
  EXPECT_EQ(message[0]["sender"], Addr(creator_));
  EXPECT_EQ(message[0]["module"], "bank");
  EXPECT_EQ(message[0]["msg_index"], "0");
  auto tx = EventsOf(sent.events(), "tx");
  ASSERT_EQ(tx.size(), 3u);
  EXPECT_EQ(tx[0]["fee_payer"], Addr(creator_));
  EXPECT_EQ(tx[1]["acc_seq"], Addr(creator_) + "/0");
  EXPECT_FALSE(tx[2]["signature"].empty());
  EXPECT_EQ(app_->Account(Addr(fresh))->first, 12u);  // after 9 genesis and 3 module accounts
  Deliver(fresh, {SendMsg(fresh, Addr(creator_), "1")});
  EXPECT_EQ(app_->Account(Addr(fresh))->second, 1u);
  ExpectRefused(fresh, {SendMsg(fresh, Addr(creator_), "5000")}, Sdk(SdkCode::kInsufficientFunds),
                "insufficient funds");
  ExpectRefused(fresh, {SendMsg(fresh, Addr(creator_), "0")}, Sdk(SdkCode::kInvalidCoins),
                "amount: amount 0 must be positive");
  ExpectRefused(fresh, {SendMsg(fresh, app_->EscrowAddress(), "1")}, Sdk(SdkCode::kUnauthorized),
                "is a module account");
  ExpectRefused(fresh, {SendMsg(fresh, "GONKA1XYZ", "1")}, Sdk(SdkCode::kInvalidAddress),
                "to_address");
  // Two messages: the second fails, so the first is undone too.
  ExpectRefused(fresh,
                {SendMsg(fresh, Addr(hosts_[0]), "10"), SendMsg(fresh, Addr(hosts_[0]), "9999")},
                Sdk(SdkCode::kInsufficientFunds),
                "message 1 (/cosmos.bank.v1beta1.MsgSend): spendable balance");
  // CheckTx queues several txs of one account.
  ASSERT_EQ(app_->CheckTx(SignTx(fresh, {SendMsg(fresh, Addr(creator_), "1")})).code(), kOk);
  ASSERT_EQ(app_->CheckTx(SignTx(fresh, {SendMsg(fresh, Addr(creator_), "1")}, 1)).code(), kOk);
  TxResponse stale = app_->CheckTx(SignTx(fresh, {SendMsg(fresh, Addr(creator_), "1")}));
  EXPECT_EQ(stale.code(), static_cast<uint32_t>(SdkCode::kWrongSequence));
  EXPECT_EQ(stale.codespace(), "sdk");
  // The check state also holds the balance effects: a spend beyond what is left is refused.
  TxResponse overspend = app_->CheckTx(SignTx(fresh, {SendMsg(fresh, Addr(creator_), "4998")}, 2));
  EXPECT_EQ(overspend.code(), static_cast<uint32_t>(SdkCode::kInsufficientFunds))
      << overspend.raw_log();
  app_->Commit();
  EXPECT_EQ(app_->CheckTx(SignTx(fresh, {SendMsg(fresh, Addr(creator_), "1")})).code(), kOk);
}

// ---------------------------------------------------------------------------------------------
// Determinism

TEST_F(ChainTest, SameBlocksGiveSameAppHashesAndRestoreContinues) {
  // Drive a full scenario on app_, recording blocks and hashes.
  std::vector<std::string> hashes;
  uint64_t shard = OpenShard(DefaultSpec());
  ReserveThree(shard);
  pb::Settlement s = MakeSettlement(shard);
  const int64_t restore_at = app_->height();
  const std::map<std::string, std::string> state_at = app_->state();
  const std::string hash_at = app_->app_hash();
  Deliver(creator_, {SettleMsg(creator_, s,
                               {SignSettlement(hosts_[0], s), SignSettlement(hosts_[1], s),
                                SignSettlement(hosts_[2], s)})});
  Deliver(creator_, {SendMsg(creator_, Addr(Key("fresh")), "77")});
  AdvanceTo(app_->height() + 3);

  // A second app fed the same blocks gives the same hash after every block.
  auto replica = App::InitChain(genesis_);
  ASSERT_TRUE(replica.ok());
  std::unique_ptr<App> restored;
  std::string previous_hash(32, '\0');
  for (size_t i = 0; i < blocks_.size(); ++i) {
    tendermint::types::Header header;
    header.set_chain_id(kChainId);
    header.set_height(static_cast<int64_t>(i) + 1);
    auto outcome = (*replica)->FinalizeBlock(header, blocks_[i]);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    (*replica)->Commit();
    // The hash chain is what the doc says.
    EXPECT_EQ(outcome->results.app_hash(), (*replica)->app_hash());
    EXPECT_NE(outcome->results.app_hash(), previous_hash);
    previous_hash = outcome->results.app_hash();
    hashes.push_back(outcome->results.app_hash());
    if (header.height() > restore_at) {
      if (restored == nullptr) {
        auto app = App::Restore(genesis_, state_at, restore_at, hash_at);
        ASSERT_TRUE(app.ok()) << app.status();
        restored = *std::move(app);
      }
      auto again = restored->FinalizeBlock(header, blocks_[i]);
      ASSERT_TRUE(again.ok());
      restored->Commit();
      EXPECT_EQ(again->results.app_hash(), outcome->results.app_hash()) << "height " << i + 1;
      EXPECT_EQ(again->changes.size(), outcome->changes.size());
    }
  }
  EXPECT_EQ((*replica)->app_hash(), app_->app_hash());
  EXPECT_EQ((*replica)->state(), app_->state());
  ASSERT_NE(restored, nullptr);
  EXPECT_EQ(restored->state(), app_->state());
  EXPECT_EQ(restored->GetShard(shard)->status(), pb::SHARD_STATUS_SETTLED);
}

TEST_F(ChainTest, ChangeSetReplaysToTheSameState) {
  std::map<std::string, std::string> mirror = app_->state();
  uint64_t shard = OpenShard(DefaultSpec());
  (void)shard;
  // Re-run the blocks on a fresh app and apply each change set to a copy of the genesis state.
  auto replica = App::InitChain(genesis_);
  ASSERT_TRUE(replica.ok());
  for (size_t i = 0; i < blocks_.size(); ++i) {
    tendermint::types::Header header;
    header.set_height(static_cast<int64_t>(i) + 1);
    auto outcome = (*replica)->FinalizeBlock(header, blocks_[i]);
    ASSERT_TRUE(outcome.ok());
    for (size_t j = 1; j < outcome->changes.size(); ++j) {
      EXPECT_LT(outcome->changes[j - 1].key, outcome->changes[j].key);
    }
    for (const auto& change : outcome->changes) {
      if (change.value.has_value()) {
        mirror[change.key] = *change.value;
      } else {
        EXPECT_EQ(mirror.erase(change.key), 1u);
      }
    }
  }
  EXPECT_EQ(mirror, app_->state());
}

TEST_F(ChainTest, RestoreRefusesAnotherGenesisAndBlocksMustBeInOrder) {
  pb::Genesis other = MakeGenesis("trainshard-other-2");
  auto restored = App::Restore(other, app_->state(), 0, std::string(32, '\0'));
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kInvalidArgument);
  tendermint::types::Header header;
  header.set_height(5);
  EXPECT_EQ(app_->FinalizeBlock(header, {}).status().code(), absl::StatusCode::kInvalidArgument);
  header.set_height(1);
  header.set_chain_id("trainshard-other-2");
  EXPECT_EQ(app_->FinalizeBlock(header, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(app_->height(), 0);
}

}  // namespace
}  // namespace ts::bridge::chain_test
