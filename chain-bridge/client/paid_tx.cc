// BuildPaidTx: a tx's gas from a simulation, its fee from the chain's minimum gas price.
#include <algorithm>

#include "chain-bridge/client/chain_client.h"
#include "chain-bridge/module/gas.h"
#include "chain-bridge/module/tx.h"
#include "common/status.h"

namespace ts::bridge {

absl::StatusOr<std::string> BuildPaidTx(ChainClient& chain, const common::PrivateKey& key,
                                        const std::string& chain_id, uint64_t account_number,
                                        uint64_t sequence,
                                        const std::vector<google::protobuf::Any>& msgs,
                                        uint64_t min_gas_limit) {
  TS_ASSIGN_OR_RETURN(cosmos::base::abci::v1beta1::TxResponse simulated,
                      chain.Simulate(BuildSimulateTx(key.public_key(), sequence, msgs)));
  uint64_t gas_limit = simulated.code() == 0 ? GasToAsk(simulated.gas_used()) : kDefaultGasLimit;
  gas_limit = std::min(kMaxTxGas, std::max(gas_limit, min_gas_limit));
  TS_ASSIGN_OR_RETURN(pb::QueryParamsResponse params, chain.Params());
  TS_ASSIGN_OR_RETURN(GasPrice price,
                      ParseGasPrice("params.min_gas_price", params.params().min_gas_price()));
  return BuildSignedTx(key, chain_id, account_number, sequence, msgs,
                       TxFee{gas_limit, RequiredFee(price, gas_limit)});
}

uint64_t GasToAsk(int64_t gas_used) {
  uint64_t used = static_cast<uint64_t>(std::max<int64_t>(gas_used, 0));
  return std::min(kMaxTxGas, used / 100 * kGasAdjustmentPercent +
                                 used % 100 * kGasAdjustmentPercent / 100 + kGasMargin);
}

}  // namespace ts::bridge
