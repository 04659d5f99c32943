// devnet_bench: transaction throughput of the devnet node, end to end.
//
// An in-process node on 127.0.0.1 (port 0) in a temporary home, with full signature checks and
// one synced RocksDB batch per block; 200 funded genesis accounts; 10,000 MsgSend txs signed
// before the clock starts; broadcast over gRPC (SYNC) from 2 client threads. The time runs from
// the first broadcast until every accepted tx is in a committed block. Prints the figures, the
// ratio to the 2,000 tx/s target and one JSON line.
//
//   devnet_bench [--txs N] [--accounts N] [--threads N] [--block-interval-ms N]
#include <stdlib.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "chain-bridge/client/chain_client.h"
#include "chain-bridge/devnet/node.h"
#include "chain-bridge/module/tx.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "cosmos/bank/v1beta1/tx.pb.h"

namespace ts::bridge {
namespace {

constexpr double kTargetTxPerS = 2000;
constexpr char kChainId[] = "devnet-bench-1";
// The genesis asks for no fee; each tx asks for this much gas.
constexpr uint64_t kGasLimit = 1'000'000;

struct Flags {
  int txs = 10000;
  int accounts = 200;
  int threads = 2;
  int64_t block_interval_ms = 100;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    auto value = [&](int64_t* out) {
      if (i + 1 >= argc) return false;
      char* end = nullptr;
      long long v = strtoll(argv[++i], &end, 10);
      if (end == nullptr || *end != '\0' || v <= 0) return false;
      *out = v;
      return true;
    };
    int64_t v = 0;
    std::string flag = argv[i];
    if (flag == "--txs" && value(&v)) {
      f->txs = static_cast<int>(v);
    } else if (flag == "--accounts" && value(&v)) {
      f->accounts = static_cast<int>(v);
    } else if (flag == "--threads" && value(&v)) {
      f->threads = static_cast<int>(v);
    } else if (flag == "--block-interval-ms" && value(&v)) {
      f->block_interval_ms = v;
    } else {
      std::fprintf(stderr, "devnet_bench: bad argument %s\n", argv[i]);
      return false;
    }
  }
  return true;
}

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

common::PrivateKey Key(int i) {
  auto key = common::PrivateKey::FromBytes(common::Sha256("devnet-bench-key-" + std::to_string(i)));
  if (!key.ok()) std::abort();  // SHA-256 of a string is a valid scalar with overwhelming odds
  return *key;
}

pb::Genesis BenchGenesis(const std::vector<std::string>& addresses) {
  pb::Genesis g;
  g.set_chain_id(kChainId);
  pb::Params* p = g.mutable_params();
  p->set_epoch_length_blocks(100000);
  p->set_voting_period_blocks(10);
  p->set_min_deposit("1000");
  p->set_quorum_ppm(334000);
  p->set_threshold_ppm(500000);
  p->set_veto_threshold_ppm(334000);
  p->set_poc_authority(addresses[0]);
  p->set_max_nodes_limit(16);
  p->set_max_weights_per_submission(100);
  p->set_max_duration_blocks_limit(100000);
  for (const std::string& a : addresses) {
    pb::GenesisAccount* acc = g.add_accounts();
    acc->set_address(a);
    acc->set_balance("1000000000");
  }
  return g;
}

int Run(const Flags& flags) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "ts_devnet_bench.XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::perror("devnet_bench: mkdtemp");
    return 1;
  }
  const std::string home = tmpl + "/home";
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{tmpl};

  std::vector<common::PrivateKey> keys;
  std::vector<std::string> addresses;
  for (int i = 0; i < flags.accounts; ++i) {
    keys.push_back(Key(i));
    addresses.push_back(common::AddressFromPublicKey(keys.back().public_key()));
  }
  if (absl::Status s = InitHome(home, BenchGenesis(addresses)); !s.ok()) {
    std::fprintf(stderr, "devnet_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  DevnetOptions options;
  options.block_interval_ms = flags.block_interval_ms;
  auto node = DevnetNode::Open(home, options);
  if (!node.ok() || !(*node)->Start().ok()) {
    std::fprintf(stderr, "devnet_bench: node: %s\n", node.status().ToString().c_str());
    return 1;
  }
  const std::string addr = (*node)->listen_address();

  // Pre-sign: account i sends txs_per_account txs (sequences 0..) to account i+1.
  auto setup_client = NewGrpcChainClient(addr);
  const int per_account = (flags.txs + flags.accounts - 1) / flags.accounts;
  std::vector<std::vector<std::string>> txs(static_cast<size_t>(flags.accounts));
  int total = 0;
  for (int i = 0; i < flags.accounts && total < flags.txs; ++i) {
    auto acc = setup_client->Account(addresses[static_cast<size_t>(i)]);
    if (!acc.ok()) {
      std::fprintf(stderr, "devnet_bench: account: %s\n", acc.status().ToString().c_str());
      return 1;
    }
    for (int s = 0; s < per_account && total < flags.txs; ++s, ++total) {
      cosmos::bank::v1beta1::MsgSend msg;
      msg.set_from_address(addresses[static_cast<size_t>(i)]);
      msg.set_to_address(addresses[static_cast<size_t>((i + 1) % flags.accounts)]);
      auto* coin = msg.add_amount();
      coin->set_denom("ngonka");
      coin->set_amount("1");
      txs[static_cast<size_t>(i)].push_back(BuildSignedTx(
          keys[static_cast<size_t>(i)], kChainId, acc->account_number,
          acc->sequence + static_cast<uint64_t>(s), {PackMsg(msg)}, TxFee{kGasLimit, 0}));
    }
  }
  const int64_t start_height = (*node)->height();
  const DevnetStats before = (*node)->stats();

  // Each thread sends, round-robin over its accounts, so every account's txs arrive in
  // sequence order (the mempool is FIFO and CheckTx accepts queued sequences).
  std::atomic<int> accepted{0}, refused{0}, failed{0};
  std::vector<double> broadcast_ms(static_cast<size_t>(flags.threads), 0);
  const double cpu0 = ProcessCpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < flags.threads; ++t) {
    threads.emplace_back([&, t] {
      auto client = NewGrpcChainClient(addr);
      for (int s = 0; s < per_account; ++s) {
        for (int i = t; i < flags.accounts; i += flags.threads) {
          const auto& mine = txs[static_cast<size_t>(i)];
          if (s >= static_cast<int>(mine.size())) continue;
          auto r = client->BroadcastRaw(mine[static_cast<size_t>(s)]);
          if (!r.ok()) {
            if (failed.fetch_add(1) < 3) {
              std::fprintf(stderr, "broadcast: %s\n", r.status().ToString().c_str());
            }
          } else if (r->code() != 0) {
            if (refused.fetch_add(1) < 3) {
              std::fprintf(stderr, "refused: code %u %s\n", r->code(), r->raw_log().c_str());
            }
          } else {
            accepted.fetch_add(1);
          }
        }
      }
      broadcast_ms[static_cast<size_t>(t)] =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    });
  }
  for (auto& th : threads) th.join();
  // mempool_size() waits for a block in progress, so zero means every accepted tx is committed.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while ((*node)->mempool_size() > 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const auto t1 = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(t1 - t0).count();
  const double cpu_seconds = ProcessCpuSeconds() - cpu0;
  const DevnetStats after = (*node)->stats();
  const int64_t end_height = (*node)->height();

  // Not timed: every account's last tx is delivered with code 0.
  int delivered_ok = 0;
  for (int i = 0; i < flags.accounts; ++i) {
    const auto& mine = txs[static_cast<size_t>(i)];
    if (mine.empty()) continue;
    auto r = setup_client->GetTx(TxHash(mine.back()));
    if (r.ok() && r->code() == 0) ++delivered_ok;
  }
  const int64_t included = after.block_txs - before.block_txs;
  const int64_t blocks = after.blocks - before.blocks;
  const int64_t tx_blocks = end_height - start_height;
  const double tx_per_s = static_cast<double>(included) / seconds;
  const double ratio = tx_per_s / kTargetTxPerS;
  auto mean = [&](double DevnetStats::*field) {
    return blocks > 0 ? (after.*field - before.*field) / static_cast<double>(blocks) : 0.0;
  };
  const double per_block = mean(&DevnetStats::block_ms);
  const int64_t checks = after.check_txs - before.check_txs;

  std::printf("devnet throughput: %d txs signed, %d accepted, %d refused, %d rpc failures\n", total,
              accepted.load(), refused.load(), failed.load());
  std::printf("  included %lld txs in %lld blocks (heights %lld..%lld) in %.3f s: %.0f tx/s\n",
              static_cast<long long>(included), static_cast<long long>(blocks),
              static_cast<long long>(start_height) + 1, static_cast<long long>(end_height), seconds,
              tx_per_s);
  std::printf("  broadcast done after %.0f ms (slowest thread)\n",
              *std::max_element(broadcast_ms.begin(), broadcast_ms.end()));
  std::printf(
      "  per block (mean): %.2f ms total = finalize %.2f + batch, commit and recheck %.2f"
      " + synced write %.2f (App unlocked)\n",
      per_block, mean(&DevnetStats::finalize_ms), mean(&DevnetStats::recheck_ms),
      mean(&DevnetStats::persist_ms));
  std::printf(
      "  CheckTx: %lld calls, %.1f us each; rechecks: %lld txs\n", static_cast<long long>(checks),
      checks > 0 ? 1000.0 * (after.check_ms - before.check_ms) / static_cast<double>(checks) : 0.0,
      static_cast<long long>(after.rechecked_txs - before.rechecked_txs));
  std::printf("  process CPU (node and clients): %.2f s, %.0f us per tx, %.2f cores busy\n",
              cpu_seconds, included > 0 ? 1e6 * cpu_seconds / static_cast<double>(included) : 0.0,
              cpu_seconds / seconds);
  std::printf("  last tx of each account delivered with code 0: %d of %d\n", delivered_ok,
              flags.accounts);
  std::printf("  target %.0f tx/s: ratio %.2f\n", kTargetTxPerS, ratio);
  std::printf(
      "{\"bench\":\"devnet_throughput\",\"txs\":%lld,\"tx_per_s\":%.1f,\"target_tx_per_s\":%.0f,"
      "\"ratio\":%.3f,\"blocks\":%lld,\"mean_block_commit_ms\":%.3f,\"mean_block_ms\":%.3f,"
      "\"seconds\":%.3f}\n",
      static_cast<long long>(included), tx_per_s, kTargetTxPerS, ratio,
      static_cast<long long>(tx_blocks), mean(&DevnetStats::persist_ms), per_block, seconds);
  (*node)->Shutdown();
  const bool complete = included == total && accepted.load() == total && delivered_ok > 0;
  return complete ? 0 : 2;
}

}  // namespace
}  // namespace ts::bridge

int main(int argc, char** argv) {
  ts::bridge::Flags flags;
  if (!ts::bridge::ParseFlags(argc, argv, &flags)) return 2;
  return ts::bridge::Run(flags);
}
