// What the devnet's tests share (node_test.cc, rpc_server_test.cc): a temporary home, fixed
// keys, a genesis funding them, a transfer message, and fast node and client options. Test-only.
#ifndef TS_CHAIN_BRIDGE_DEVNET_DEVNET_TEST_UTIL_H_
#define TS_CHAIN_BRIDGE_DEVNET_DEVNET_TEST_UTIL_H_

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "chain-bridge/client/chain_client.h"
#include "chain-bridge/devnet/node.h"
#include "chain-bridge/module/tx.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "cosmos/bank/v1beta1/tx.pb.h"
#include "gtest/gtest.h"

namespace ts::bridge::devnet_test {

constexpr char kChainId[] = "devnet-test-1";
constexpr uint64_t kInitialBalance = 1'000'000;
// The genesis asks for no fee; each tx asks for this much gas.
constexpr uint64_t kGasLimit = 1'000'000;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ts_devnet_test.XXXXXX").string();
    EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline common::PrivateKey Key(int i) {
  auto key = common::PrivateKey::FromBytes(common::Sha256("devnet-test-key-" + std::to_string(i)));
  EXPECT_TRUE(key.ok());
  return *key;
}

inline std::string Addr(int i) { return common::AddressFromPublicKey(Key(i).public_key()); }

inline pb::Genesis TestGenesis(int accounts) {
  pb::Genesis g;
  g.set_chain_id(kChainId);
  pb::Params* p = g.mutable_params();
  p->set_epoch_length_blocks(1000);
  p->set_voting_period_blocks(10);
  p->set_min_deposit("1000");
  p->set_quorum_ppm(334000);
  p->set_threshold_ppm(500000);
  p->set_veto_threshold_ppm(334000);
  p->set_poc_authority(Addr(0));
  p->set_max_nodes_limit(16);
  p->set_max_weights_per_submission(100);
  p->set_max_duration_blocks_limit(100000);
  for (int i = 0; i < accounts; ++i) {
    pb::GenesisAccount* a = g.add_accounts();
    a->set_address(Addr(i));
    a->set_balance(std::to_string(kInitialBalance));
  }
  pb::HostWeight* w = g.add_poc_weights();
  w->set_host(Addr(1));
  w->set_weight(100);
  return g;
}

inline google::protobuf::Any Send(int from, int to, uint64_t amount) {
  cosmos::bank::v1beta1::MsgSend msg;
  msg.set_from_address(Addr(from));
  msg.set_to_address(Addr(to));
  auto* coin = msg.add_amount();
  coin->set_denom("ngonka");
  coin->set_amount(std::to_string(amount));
  return PackMsg(msg);
}

inline ChainClientOptions FastClient() {
  ChainClientOptions o;
  o.call_timeout_ms = 5000;
  o.retry_backoff_ms = 20;
  o.inclusion_timeout_ms = 15000;
  return o;
}

inline DevnetOptions FastNode() {
  DevnetOptions o;
  o.block_interval_ms = 40;
  return o;
}

}  // namespace ts::bridge::devnet_test

#endif  // TS_CHAIN_BRIDGE_DEVNET_DEVNET_TEST_UTIL_H_
