// The HostCore unit tests' common ground, for tests only: a fresh state directory, this host's
// key and address and another host's, the in-memory fake chain and clock, and a HostCore opened
// over them with the test's options.
#ifndef TS_SIDECAR_HOST_HOST_CORE_FIXTURE_H_
#define TS_SIDECAR_HOST_HOST_CORE_FIXTURE_H_

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/crypto/bech32.h"
#include "common/status.h"
#include "sidecar/host/fake_chain_client.h"
#include "sidecar/host/host_core.h"

namespace ts::sidecar::testing {

class HostCoreFixture : public ::testing::Test {
 protected:
  explicit HostCoreFixture(const std::string& chain_id) : chain_(chain_id) {}

  // A fresh directory, the two addresses and this host's account (number 7, sequence 0).
  void SetUp() override {
    std::string dir = ::testing::TempDir() + "ts-hostcore-XXXXXX";
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    dir_ = dir;
    address_ = common::AddressFromPublicKey(key_.public_key());
    other_ = common::AddressFromPublicKey(KeyOf(0x22).public_key());
    chain_.SetAccount(address_, 7, 0);
    options_.shard_endpoint = "127.0.0.1:7001";
  }
  void TearDown() override {
    core_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  void Open() {
    auto core = HostCore::Open(dir_ + "/state", key_, options_, &chain_, &clock_);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = *std::move(core);
  }
  // A restart: the records are closed and opened again from the same directory.
  void Reopen() {
    core_.reset();
    Open();
  }
  void Step() {
    absl::Status s = core_->Step();
    ASSERT_TRUE(s.ok()) << s;
  }

  std::vector<gonka::trainshard::v1::FollowedEvent> Events() {
    auto events = core_->store().ListEvents(0, 100000);
    TS_CHECK(events.ok());
    return *events;
  }
  gonka::trainshard::v1::HostShardRecord Shard(uint64_t id) {
    auto rec = core_->store().GetShard(id);
    TS_CHECK(rec.ok());
    return *rec;
  }
  std::vector<gonka::trainshard::v1::PendingTx> Pending() {
    auto p = core_->store().ListPendingTxs();
    TS_CHECK(p.ok());
    return *p;
  }

  std::string dir_;
  common::PrivateKey key_ = KeyOf(0x11);
  std::string address_;
  std::string other_;
  FakeChainClient chain_;
  FakeClock clock_;
  HostCoreOptions options_;
  std::unique_ptr<HostCore> core_;
};

}  // namespace ts::sidecar::testing

#endif  // TS_SIDECAR_HOST_HOST_CORE_FIXTURE_H_
