// AbciApp: the chain's App (chain-bridge/module/app.h) answering ABCI 2.0 requests as CometBFT
// v0.38 sends them (tendermint/abci/types.proto), one Request to one Response, with no socket
// in sight; AbciServer (abci_server.h) carries them over CometBFT's socket protocol. The ABCI
// face changes nothing in the state machine: the same blocks give the same app hashes as the
// devnet node's.
//
// The mapping (docs/chain-module.md, "The ABCI face"):
//   Info            last committed height and app hash; data "trainshard", options' version.
//   InitChain       creates the App from the genesis given here; the request's chain_id must be
//                   the genesis's, initial_height 0 or 1. Answers the app hash at height 0.
//   CheckTx         App::CheckTx (new and recheck alike: Commit resets the check state, and
//                   CometBFT rechecks the mempool in order).
//   PrepareProposal the longest prefix of the txs within max_tx_bytes and kMaxTxsPerBlock, less
//                   those that do not decode, so this node's proposals pass ProcessProposal.
//   ProcessProposal ACCEPT unless a tx does not decode or the block is over kMaxTxsPerBlock.
//   FinalizeBlock   App::FinalizeBlock at height app.height()+1 (anything else is an error
//                   naming both heights); tx results, the end-block events and the app hash.
//                   The uncommitted block sent again (same height and hash) gets the same
//                   answer: CometBFT replays it after a restart between FinalizeBlock and Commit.
//   Commit          App::Commit; retain_height 0 (the App keeps no history to prune).
//   Query           the devnet's gRPC query services (services.h) called in process by their
//                   method path, e.g. /cosmos.bank.v1beta1.Query/Balance, at the latest height.
//   ExtendVote / VerifyVoteExtension: empty / ACCEPT. Snapshots: none are offered, an offered
//   one is ABORTed (state sync is not supported), chunks are empty / ABORT.
//
// The App lives in memory only: after a restart Info reports height 0 and CometBFT replays its
// blocks through InitChain and FinalizeBlock, which rebuilds the same state.
//
// Thread-safety: thread-safe. One mutex serialises every request that touches the App, so the
// four connections CometBFT opens (consensus, mempool, query, snapshot) see one order.
#ifndef TS_CHAIN_BRIDGE_DEVNET_ABCI_APP_H_
#define TS_CHAIN_BRIDGE_DEVNET_ABCI_APP_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "chain-bridge/module/app.h"
#include "gonka/trainshard/v1/chain.pb.h"
#include "tendermint/abci/types.pb.h"

namespace ts::bridge::devnet {

// Longest Query path served (a gRPC method path).
inline constexpr size_t kMaxQueryPathBytes = 256;

struct AbciAppOptions {
  // ResponseInfo.version and app_version.
  std::string version = "trainshard-abci";
  uint64_t app_version = 1;
  // A Query's in-process gRPC call gives up after this long.
  int64_t query_timeout_ms = 10000;
};

class AbciApp {
 public:
  // Checks the genesis by starting a chain from it (INVALID_ARGUMENT naming the field) and
  // starts the in-process query services (INTERNAL if gRPC cannot). No App exists until
  // InitChain.
  static absl::StatusOr<std::unique_ptr<AbciApp>> Create(pb::Genesis genesis,
                                                         AbciAppOptions options = {});
  ~AbciApp();

  AbciApp(const AbciApp&) = delete;
  AbciApp& operator=(const AbciApp&) = delete;

  // Answers one request (Flush and Echo included). An error is what the server sends as a
  // ResponseException before closing the connection: INVALID_ARGUMENT for a request that names
  // the wrong chain or height or has no value, FAILED_PRECONDITION for a request out of order
  // (FinalizeBlock before InitChain, a second InitChain, FinalizeBlock twice without Commit),
  // and the App's own errors. CheckTx and Query never fail: their refusals are codes.
  absl::StatusOr<tendermint::abci::Response> Handle(const tendermint::abci::Request& request);

  // The last committed height (0 before the first Commit).
  int64_t committed_height() const;

 private:
  class QueryBackend;
  struct QueryChannel;

  AbciApp(pb::Genesis genesis, AbciAppOptions options);

  tendermint::abci::ResponseInfo Info();
  absl::StatusOr<tendermint::abci::ResponseInitChain> InitChain(
      const tendermint::abci::RequestInitChain& request);
  tendermint::abci::ResponseCheckTx CheckTx(const tendermint::abci::RequestCheckTx& request);
  tendermint::abci::ResponseQuery Query(const tendermint::abci::RequestQuery& request);
  absl::StatusOr<tendermint::abci::ResponseFinalizeBlock> FinalizeBlock(
      const tendermint::abci::RequestFinalizeBlock& request);
  absl::StatusOr<tendermint::abci::ResponseCommit> Commit();

  const pb::Genesis genesis_;
  const AbciAppOptions options_;

  mutable absl::Mutex mu_;
  std::unique_ptr<App> app_ ABSL_GUARDED_BY(mu_);
  // What Info reports: FinalizeBlock moves the App to the next height at once, but CometBFT
  // counts a block only once Commit has returned.
  int64_t committed_height_ ABSL_GUARDED_BY(mu_) = 0;
  std::string committed_app_hash_ ABSL_GUARDED_BY(mu_);
  // A block finalized and not yet committed, its hash and the answer given. CometBFT sends the
  // same block again if it restarted between FinalizeBlock and Commit; the App cannot run it
  // twice, so the answer is repeated.
  bool finalized_ ABSL_GUARDED_BY(mu_) = false;
  std::string finalized_hash_ ABSL_GUARDED_BY(mu_);
  tendermint::abci::ResponseFinalizeBlock finalized_response_ ABSL_GUARDED_BY(mu_);

  // The query services over an in-process channel; they reach the App through QueryBackend,
  // which takes mu_, so Query runs without holding it.
  std::unique_ptr<QueryBackend> backend_;
  std::unique_ptr<QueryChannel> queries_;
};

}  // namespace ts::bridge::devnet

#endif  // TS_CHAIN_BRIDGE_DEVNET_ABCI_APP_H_
