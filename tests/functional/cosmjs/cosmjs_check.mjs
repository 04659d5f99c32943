// An independent Cosmos client check of a trainshard devnet node, written with CosmJS from the npm
// registry (versions pinned in package.json; `npm ci` here first). It talks to the node's
// CometBFT JSON-RPC endpoint the way wallets and explorers do (StargateClient,
// SigningStargateClient, connectComet's version auto-detection, the /websocket subscription) and
// checks what such a client gets:
//
//   node cosmjs_check.mjs CONFIG_JSON_PATH
//
// CONFIG_JSON_PATH names a JSON object:
//   {"rpc": "http://127.0.0.1:PORT", "chain_id": "...", "denom": "ngonka", "prefix": "gonka",
//    "gas_price": "0.002ngonka", "sender_key_hex": "<64 hex>", "amino_key_hex": "<64 hex>",
//    "recipient": "gonka1...", "poor_key_hex": "<64 hex>",
//    "voters": [{"key_hex": "<64 hex>", "proposal_id": "1"}],
//    "grpc": "127.0.0.1:PORT",
//    "steps": ["connect", "send_auto", "search", "amino_send", "fee_above_balance", "vote",
//              "websocket", "grpc_reflection"]}
// Optional keys: "step_timeout_s" (60), "poll_interval_ms" (CosmJS's broadcast polling, 1000),
// "expect_comet_client" (e.g. "Comet38Client": the class connectComet must pick).
//
// Steps (each runs only if listed, in the order above; "search" needs "send_auto"):
//   connect            StargateClient.connect: getChainId() is chain_id, getHeight() > 0,
//                      getAllBalances(recipient) is one coin of denom; reports the node's version
//                      string and the Comet client class it selected.
//   send_auto          DirectSecp256k1Wallet (SIGN_MODE_DIRECT) + gasPrice: simulate() > 0, then
//                      sendTokens 1000 denom with "auto" gas: code 0, gasUsed <= gasWanted, the
//                      tx's fee is ceil(gas_limit * gas_price), the recipient gains exactly 1000
//                      and the sender loses exactly 1000 + fee.
//   search             searchTx by transfer.recipient, by message.sender, by both and by
//                      tx.height finds the send_auto tx; getTx(hash) returns it with code 0.
//   amino_send         Secp256k1Wallet (amino only: SIGN_MODE_LEGACY_AMINO_JSON) sends 1000 with
//                      "auto" gas: code 0, sign mode 127 in the tx, the balances move exactly.
//   fee_above_balance  the poor key offers a fee of its balance + 1000000: the broadcast is
//                      refused in CheckTx with code 5 in codespace "sdk" (BroadcastTxError) and
//                      its balance does not change.
//   vote               each voter signs /cosmos.gov.v1.MsgVote YES with "auto" gas: code 0.
//   websocket          connectComet over ws://.../websocket, subscribeNewBlock(): two events, the
//                      heights increasing, the header's chain id is chain_id; subscribeTx by
//                      message.sender, then the sender sends 1 denom to itself: the event carries
//                      the tx's hash and height and code 0.
//   grpc_reflection    over the node's gRPC port ("grpc"), with @grpc/grpc-js and
//                      grpc-js-reflection-client as grpcurl would: server reflection lists the
//                      Cosmos services and the module's; the tendermint service's descriptor,
//                      fetched by symbol, makes a client whose GetNodeInfo names chain_id,
//                      GetSyncing is false, GetLatestBlock and GetBlockByHeight agree.
//
// Prints one JSON line per step on stdout ({"step": ..., "ok": true|false, ...details}),
// diagnostics on stderr; exits 0 only if every listed step is ok, 1 if one failed, 2 on a bad
// config. Every step (every voter, for "vote") fails with a message after step_timeout_s.

import fs from 'node:fs';

import {Secp256k1Wallet} from '@cosmjs/amino';
import {fromHex, toHex} from '@cosmjs/encoding';
import {DirectSecp256k1Wallet, Registry, decodeTxRaw} from '@cosmjs/proto-signing';
import {
  BroadcastTxError,
  GasPrice,
  SigningStargateClient,
  StargateClient,
  defaultRegistryTypes,
} from '@cosmjs/stargate';
import {connectComet} from '@cosmjs/tendermint-rpc';
import * as grpc from '@grpc/grpc-js';
import {GrpcReflection} from 'grpc-js-reflection-client';
import {VoteOption} from 'cosmjs-types/cosmos/gov/v1/gov';
import {MsgVote} from 'cosmjs-types/cosmos/gov/v1/tx';

const kAllSteps = [
  'connect', 'send_auto', 'search', 'amino_send', 'fee_above_balance', 'vote', 'websocket',
  'grpc_reflection',
];
// What a Cosmos tool expects a node's reflection to list, and the module's own query service.
const kReflectedServices = [
  'cosmos.auth.v1beta1.Query', 'cosmos.bank.v1beta1.Query', 'cosmos.base.node.v1beta1.Service',
  'cosmos.base.tendermint.v1beta1.Service',
  'cosmos.tx.v1beta1.Service', 'gonka.trainshard.v1.Query',
];
const kSendAmount = 1000n;
const kSignModeDirect = 1;
const kSignModeLegacyAminoJson = 127;
const kDefaultGasMultiplier = 1.4;  // SigningStargateClient.defaultGasMultiplier in 0.39

function usage(message) {
  process.stderr.write(`cosmjs_check: ${message}\nusage: node cosmjs_check.mjs CONFIG_JSON_PATH\n`);
  process.exit(2);
}

function log(message) {
  process.stderr.write(`cosmjs_check: ${message}\n`);
}

// JSON with BigInts as decimal strings and byte arrays as hex.
function toJson(value) {
  return JSON.stringify(value, (_key, v) => {
    if (typeof v === 'bigint') return v.toString();
    if (v instanceof Uint8Array) return toHex(v);
    return v;
  });
}

class CheckFailure extends Error {}

function check(condition, message) {
  if (!condition) throw new CheckFailure(message);
}

function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_resolve, reject) => {
    timer = setTimeout(
        () => reject(new CheckFailure(`${what} did not finish within ${ms / 1000} s`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

function errorText(error) {
  if (error instanceof CheckFailure) return error.message;
  if (!(error instanceof Error)) return String(error);
  const cause = error.cause instanceof Error ? ` (${error.cause.message})` : '';
  return `${error.name}: ${error.message}${cause}`;
}

function keyBytes(hex, name) {
  const clean = String(hex ?? '').replace(/^0x/, '');
  check(/^[0-9a-fA-F]{64}$/.test(clean), `${name} must be 64 hex characters`);
  return fromHex(clean);
}

// "0.002ngonka" -> {num: 2n, den: 1000n, denom: "ngonka"}, exact, for ceil(gas * price).
function parseGasPrice(text) {
  const m = /^([0-9]+)(?:\.([0-9]+))?([a-zA-Z][a-zA-Z0-9/:._-]*)$/.exec(text);
  check(m, `gas_price ${JSON.stringify(text)} is not <decimal><denom>`);
  const frac = m[2] ?? '';
  return {num: BigInt(m[1] + frac), den: 10n ** BigInt(frac.length), denom: m[3]};
}

function ceilFee(gasLimit, price) {
  const product = BigInt(gasLimit) * price.num;
  return (product + price.den - 1n) / price.den;
}

async function balanceOf(client, address, denom) {
  const coin = await client.getBalance(address, denom);
  check(coin && coin.denom === denom, `getBalance(${address}) answered ${toJson(coin)}`);
  return BigInt(coin.amount);
}

// The fee, gas limit and sign mode of a committed tx, read back from the chain (getTx).
async function txFacts(client, hash) {
  const indexed = await client.getTx(hash);
  check(indexed, `getTx(${hash}) found nothing after the tx was committed`);
  const decoded = decodeTxRaw(indexed.tx);
  const fee = decoded.authInfo.fee;
  check(fee, 'the tx has no fee');
  const modes = decoded.authInfo.signerInfos.map((si) => si.modeInfo?.single?.mode);
  return {
    indexed,
    feeCoins: fee.amount.map((c) => ({denom: c.denom, amount: c.amount})),
    gasLimit: fee.gasLimit,
    signModes: modes,
  };
}

function feeAmountIn(coins, denom) {
  let total = 0n;
  for (const c of coins) {
    check(c.denom === denom, `the fee has a coin of denom ${c.denom}, expected only ${denom}`);
    total += BigInt(c.amount);
  }
  return total;
}

// Signs and broadcasts a MsgSend with "auto" gas from `wallet` and checks the exact balance moves.
async function sendAndCheck(cfg, out, wallet, {expectSignMode, simulateFirst}) {
  const [account] = await wallet.getAccounts();
  const sender = account.address;
  const client = await SigningStargateClient.connectWithSigner(cfg.rpc, wallet, {
    gasPrice: GasPrice.fromString(cfg.gas_price),
    broadcastPollIntervalMs: cfg.poll_interval_ms,
    broadcastTimeoutMs: Math.max(5000, cfg.step_timeout_ms - 5000),
  });
  try {
    Object.assign(out, {sender, recipient: cfg.recipient});
    const senderBefore = await balanceOf(client, sender, cfg.denom);
    const recipientBefore = await balanceOf(client, cfg.recipient, cfg.denom);
    out.balances_before = {sender: senderBefore, recipient: recipientBefore};
    const amount = [{denom: cfg.denom, amount: kSendAmount.toString()}];
    if (simulateFirst) {
      const msg = {
        typeUrl: '/cosmos.bank.v1beta1.MsgSend',
        value: {fromAddress: sender, toAddress: cfg.recipient, amount},
      };
      const simulated = await client.simulate(sender, [msg], '');
      out.simulated_gas = simulated;
      out.expected_gas_limit = Math.ceil(simulated * kDefaultGasMultiplier);
      check(Number.isInteger(simulated) && simulated > 0, `simulate() gave ${simulated}, not > 0`);
    }
    const result = await client.sendTokens(sender, cfg.recipient, amount, 'auto');
    out.txhash = result.transactionHash;
    out.height = result.height;
    out.code = result.code;
    out.gasWanted = result.gasWanted;
    out.gasUsed = result.gasUsed;
    out.raw_log = result.rawLog;
    check(result.code === 0, `the tx failed with code ${result.code}: ${result.rawLog}`);
    check(result.height > 0, `the tx result has height ${result.height}`);
    check(result.gasUsed <= result.gasWanted,
        `gasUsed ${result.gasUsed} is more than gasWanted ${result.gasWanted}`);
    const facts = await txFacts(client, result.transactionHash);
    out.fee = facts.feeCoins;
    out.gas_limit = facts.gasLimit;
    out.sign_modes = facts.signModes;
    check(facts.indexed.code === 0, `getTx gives code ${facts.indexed.code}`);
    check(facts.gasLimit === result.gasWanted,
        `the tx's gas limit ${facts.gasLimit} is not its gasWanted ${result.gasWanted}`);
    check(facts.signModes.length === 1 && facts.signModes[0] === expectSignMode,
        `sign modes ${toJson(facts.signModes)}, expected [${expectSignMode}]`);
    const fee = feeAmountIn(facts.feeCoins, cfg.denom);
    const expectedFee = ceilFee(facts.gasLimit, parseGasPrice(cfg.gas_price));
    out.fee_amount = fee;
    out.expected_fee_amount = expectedFee;
    check(fee === expectedFee,
        `the fee is ${fee}${cfg.denom}, expected ceil(${facts.gasLimit} * ${cfg.gas_price}) = ` +
        `${expectedFee}`);
    const senderAfter = await balanceOf(client, sender, cfg.denom);
    const recipientAfter = await balanceOf(client, cfg.recipient, cfg.denom);
    out.balances_after = {sender: senderAfter, recipient: recipientAfter};
    check(recipientAfter - recipientBefore === kSendAmount,
        `the recipient gained ${recipientAfter - recipientBefore}, expected ${kSendAmount}`);
    check(senderBefore - senderAfter === kSendAmount + fee,
        `the sender lost ${senderBefore - senderAfter}, expected ${kSendAmount} + fee ${fee}`);
  } finally {
    client.disconnect();
  }
}

const state = {};  // what later steps need from earlier ones

// Each step fills `out` (its line's details, reported also when it fails) and throws on failure.
const steps = {
  async connect(cfg, out) {
    const client = await StargateClient.connect(cfg.rpc);
    try {
      const comet = client.getCometClient();
      const status = await comet.status();
      const chainId = await client.getChainId();
      const height = await client.getHeight();
      Object.assign(out, {
        chain_id: chainId,
        height,
        node_version: status.nodeInfo.version,
        comet_client: comet.constructor.name,
      });
      check(chainId === cfg.chain_id, `getChainId() is ${chainId}, expected ${cfg.chain_id}`);
      check(Number.isInteger(height) && height > 0, `getHeight() is ${height}, not > 0`);
      const balances = await client.getAllBalances(cfg.recipient);
      out.all_balances = balances;
      check(balances.length === 1 && balances[0].denom === cfg.denom,
          `getAllBalances(recipient) is ${JSON.stringify(balances)}, expected one ${cfg.denom} coin`);
      if (cfg.expect_comet_client) {
        check(out.comet_client === cfg.expect_comet_client,
            `connectComet picked ${out.comet_client} for version ` +
            `${JSON.stringify(out.node_version)}, expected ${cfg.expect_comet_client}`);
      }
    } finally {
      client.disconnect();
    }
  },

  async send_auto(cfg, out) {
    const wallet = await DirectSecp256k1Wallet.fromKey(
        keyBytes(cfg.sender_key_hex, 'sender_key_hex'), cfg.prefix);
    await sendAndCheck(cfg, out, wallet, {expectSignMode: kSignModeDirect, simulateFirst: true});
    state.send = {txhash: out.txhash, height: out.height, sender: out.sender};
  },

  async search(cfg, out) {
    check(state.send, 'needs a successful send_auto step before it');
    const {txhash, height, sender} = state.send;
    const client = await StargateClient.connect(cfg.rpc);
    try {
      out.txhash = txhash;
      const queries = {
        by_recipient: [{key: 'transfer.recipient', value: cfg.recipient}],
        by_sender: [{key: 'message.sender', value: sender}],
        by_both: [
          {key: 'transfer.recipient', value: cfg.recipient},
          {key: 'message.sender', value: sender},
        ],
        by_height: [{key: 'tx.height', value: height}],  // a number: sent unquoted
      };
      for (const [name, query] of Object.entries(queries)) {
        const found = await client.searchTx(query);
        out[name] = {count: found.length, hashes: found.map((t) => t.hash)};
        check(found.some((t) => t.hash === txhash),
            `searchTx ${name} (${toJson(query)}) did not find ${txhash}: ` +
            `got ${toJson(out[name].hashes)}`);
      }
      const tx = await client.getTx(txhash);
      check(tx, `getTx(${txhash}) returned null`);
      out.get_tx = {
        hash: tx.hash, height: tx.height, code: tx.code,
        gasUsed: tx.gasUsed, gasWanted: tx.gasWanted,
      };
      check(tx.hash === txhash, `getTx returned hash ${tx.hash}`);
      check(tx.code === 0, `getTx gives code ${tx.code}`);
      check(tx.height === height, `getTx gives height ${tx.height}, the broadcast gave ${height}`);
      const missing = await client.getTx('00'.repeat(32).toUpperCase());
      out.unknown_hash_is_null = missing === null;
      check(missing === null, 'getTx of an unknown hash did not return null');
    } finally {
      client.disconnect();
    }
  },

  async amino_send(cfg, out) {
    const wallet = await Secp256k1Wallet.fromKey(
        keyBytes(cfg.amino_key_hex, 'amino_key_hex'), cfg.prefix);
    await sendAndCheck(cfg, out, wallet,
        {expectSignMode: kSignModeLegacyAminoJson, simulateFirst: false});
  },

  async fee_above_balance(cfg, out) {
    const wallet = await DirectSecp256k1Wallet.fromKey(
        keyBytes(cfg.poor_key_hex, 'poor_key_hex'), cfg.prefix);
    const [{address}] = await wallet.getAccounts();
    const client = await SigningStargateClient.connectWithSigner(cfg.rpc, wallet, {
      broadcastPollIntervalMs: cfg.poll_interval_ms,
      broadcastTimeoutMs: Math.max(5000, cfg.step_timeout_ms - 5000),
    });
    try {
      const before = await balanceOf(client, address, cfg.denom);
      const fee = {
        amount: [{denom: cfg.denom, amount: (before + 1000000n).toString()}], gas: '200000',
      };
      Object.assign(out, {address, balance_before: before, fee});
      let refusal;
      try {
        const result = await client.sendTokens(
            address, cfg.recipient, [{denom: cfg.denom, amount: '1'}], fee);
        out.included = {
          txhash: result.transactionHash, height: result.height, code: result.code,
          raw_log: result.rawLog,
        };
      } catch (error) {
        refusal = error;
      }
      check(refusal !== undefined,
          `the broadcast was not refused: the tx was included at height ${out.included?.height} ` +
          `with code ${out.included?.code}`);
      out.refusal = errorText(refusal);
      if (refusal instanceof BroadcastTxError) {
        Object.assign(out, {code: refusal.code, codespace: refusal.codespace, log: refusal.log});
      }
      check(refusal instanceof BroadcastTxError,
          `expected a BroadcastTxError (a CheckTx refusal), got ${out.refusal}`);
      check(refusal.code === 5 && refusal.codespace === 'sdk',
          `refused with code ${refusal.code} in codespace ${JSON.stringify(refusal.codespace)}, ` +
          'expected 5 in "sdk"');
      const after = await balanceOf(client, address, cfg.denom);
      out.balance_after = after;
      check(after === before, `the poor account's balance changed from ${before} to ${after}`);
    } finally {
      client.disconnect();
    }
  },

  async vote(cfg, out) {
    check(Array.isArray(cfg.voters) && cfg.voters.length > 0, 'voters must be a non-empty list');
    const registry = new Registry([...defaultRegistryTypes, ['/cosmos.gov.v1.MsgVote', MsgVote]]);
    const votes = [];
    out.votes = votes;
    for (const [i, voter] of cfg.voters.entries()) {
      const entry = {index: i, proposal_id: String(voter.proposal_id)};
      votes.push(entry);
      const one = async () => {
        const wallet = await DirectSecp256k1Wallet.fromKey(
            keyBytes(voter.key_hex, `voters[${i}].key_hex`), cfg.prefix);
        const [{address}] = await wallet.getAccounts();
        entry.voter = address;
        const client = await SigningStargateClient.connectWithSigner(cfg.rpc, wallet, {
          registry,
          gasPrice: GasPrice.fromString(cfg.gas_price),
          broadcastPollIntervalMs: cfg.poll_interval_ms,
          broadcastTimeoutMs: Math.max(5000, cfg.step_timeout_ms - 5000),
        });
        try {
          const msg = {
            typeUrl: '/cosmos.gov.v1.MsgVote',
            value: MsgVote.fromPartial({
              proposalId: BigInt(voter.proposal_id),
              voter: address,
              option: VoteOption.VOTE_OPTION_YES,
              metadata: '',
            }),
          };
          const result = await client.signAndBroadcast(address, [msg], 'auto');
          Object.assign(entry, {
            txhash: result.transactionHash, height: result.height, code: result.code,
            gasWanted: result.gasWanted, gasUsed: result.gasUsed, raw_log: result.rawLog,
          });
          check(result.code === 0,
              `voter ${i} (${address}): the vote failed with code ${result.code}: ` +
              `${result.rawLog}`);
        } finally {
          client.disconnect();
        }
      };
      await withTimeout(one(), cfg.step_timeout_ms, `voter ${i}`);
    }
  },

  async websocket(cfg, out) {
    const wsUrl = cfg.rpc.replace(/^http(s?):\/\//, 'ws$1://');
    check(wsUrl.startsWith('ws'), `rpc ${cfg.rpc} is not an http(s) URL`);
    const client = await connectComet(wsUrl);  // WebsocketClient: wsUrl + "/websocket"
    Object.assign(out, {
      url: `${wsUrl.replace(/\/$/, '')}/websocket`,
      comet_client: client.constructor.name,
      blocks: [],
    });
    let subscription;
    let txSubscription;
    try {
      await new Promise((resolve, reject) => {
        subscription = client.subscribeNewBlock().subscribe({
          next: (block) => {
            out.blocks.push({height: block.header.height, chain_id: block.header.chainId,
              time: block.header.time.toISOString(), txs: block.txs.length});
            if (out.blocks.length === 2) resolve();
          },
          error: (error) => reject(
              new CheckFailure(`the NewBlock subscription failed: ${errorText(error)}`)),
          complete: () => reject(new CheckFailure(
              `the NewBlock subscription ended after ${out.blocks.length} event(s)`)),
        });
      });
      const [a, b] = out.blocks;
      check(a.height > 0 && b.height > a.height, `NewBlock heights ${a.height} then ${b.height}`);
      check(a.chain_id === cfg.chain_id && b.chain_id === cfg.chain_id,
          `NewBlock chain ids ${a.chain_id}, ${b.chain_id}, expected ${cfg.chain_id}`);
      // A Tx subscription by the SDK's event keys: the sender's own send arrives with its hash.
      const wallet = await DirectSecp256k1Wallet.fromKey(
          keyBytes(cfg.sender_key_hex, 'sender_key_hex'), cfg.prefix);
      const [account] = await wallet.getAccounts();
      const query = `tm.event='Tx' AND message.sender='${account.address}'`;
      let resolveTx;
      let rejectTx;
      const txSeen = new Promise((resolve, reject) => {
        resolveTx = resolve;
        rejectTx = reject;
      });
      txSubscription = client.subscribeTx(query).subscribe({
        next: (event) => resolveTx(event),
        error: (error) => rejectTx(
            new CheckFailure(`the Tx subscription failed: ${errorText(error)}`)),
      });
      const signer = await SigningStargateClient.connectWithSigner(cfg.rpc, wallet, {
        gasPrice: GasPrice.fromString(cfg.gas_price),
        broadcastPollIntervalMs: cfg.poll_interval_ms,
      });
      try {
        const sent = await signer.sendTokens(account.address, account.address,
            [{denom: cfg.denom, amount: '1'}], 'auto');
        check(sent.code === 0, `the self-send failed with code ${sent.code}`);
        const event = await txSeen;
        out.tx_event = {hash: toHex(event.hash).toUpperCase(), height: event.height,
          code: event.result.code};
        check(out.tx_event.hash === sent.transactionHash,
            `Tx event hash ${out.tx_event.hash}, sent ${sent.transactionHash}`);
        check(event.height === sent.height, `Tx event height ${event.height}, sent ${sent.height}`);
        check(event.result.code === 0, `Tx event code ${event.result.code}`);
      } finally {
        signer.disconnect();
      }
    } finally {
      if (subscription) subscription.unsubscribe();
      if (txSubscription) txSubscription.unsubscribe();
      client.disconnect();
    }
  },
};

// One unary call of a grpc-js client made from a reflected descriptor.
function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, (error, response) => (error ? reject(error) : resolve(response)));
  });
}

steps.grpc_reflection = async function(cfg, out) {
  check(typeof cfg.grpc === 'string' && cfg.grpc.length > 0, 'the config lacks "grpc"');
  const credentials = grpc.ChannelCredentials.createInsecure();
  const reflection = new GrpcReflection(cfg.grpc, credentials);
  const services = await reflection.listServices();
  out.services = services;
  for (const name of kReflectedServices) {
    check(services.includes(name), `reflection does not list ${name}`);
  }
  const txMethods = (await reflection.listMethods('cosmos.tx.v1beta1.Service')).map((m) => m.name);
  check(txMethods.includes('Simulate') && txMethods.includes('BroadcastTx'),
      `cosmos.tx.v1beta1.Service lists ${txMethods.join(', ')}`);
  const descriptor = await reflection.getDescriptorBySymbol('cosmos.base.tendermint.v1beta1.Service');
  const pkg = descriptor.getPackageObject(
      {keepCase: true, longs: String, enums: String, defaults: true});
  const Service = pkg.cosmos.base.tendermint.v1beta1.Service;
  const client = new Service(cfg.grpc, credentials);
  try {
    const info = await unary(client, 'GetNodeInfo', {});
    out.network = info.default_node_info.network;
    out.node_version = info.default_node_info.version;
    check(out.network === cfg.chain_id, `GetNodeInfo network ${out.network}, expected ${cfg.chain_id}`);
    const syncing = await unary(client, 'GetSyncing', {});
    check(syncing.syncing === false, `GetSyncing says ${syncing.syncing}`);
    const latest = await unary(client, 'GetLatestBlock', {});
    const height = latest.sdk_block.header.height;
    out.latest_height = height;
    check(Number(height) > 0, `GetLatestBlock height ${height}`);
    check(latest.sdk_block.header.proposer_address.startsWith(`${cfg.prefix}valcons1`),
        `proposer ${latest.sdk_block.header.proposer_address}`);
    const byHeight = await unary(client, 'GetBlockByHeight', {height});
    check(Buffer.from(byHeight.block_id.hash).equals(Buffer.from(latest.block_id.hash)),
        'GetBlockByHeight(latest) has another block id than GetLatestBlock');
  } finally {
    client.close();
  }
};

function loadConfig(path) {
  let cfg;
  try {
    cfg = JSON.parse(fs.readFileSync(path, 'utf8'));
  } catch (error) {
    usage(`cannot read the config ${path}: ${errorText(error)}`);
  }
  for (const key of ['rpc', 'chain_id', 'denom', 'prefix', 'steps']) {
    if (cfg[key] === undefined) usage(`the config lacks "${key}"`);
  }
  if (!/^https?:\/\//.test(cfg.rpc)) {
    usage(`rpc must be an http:// or https:// URL, got ${cfg.rpc}`);
  }
  if (!Array.isArray(cfg.steps)) usage('steps must be a list');
  cfg.step_timeout_ms = 1000 * (cfg.step_timeout_s ?? 60);
  cfg.poll_interval_ms = cfg.poll_interval_ms ?? 1000;
  return cfg;
}

async function main() {
  if (process.argv.length !== 3) usage('expected exactly one argument');
  const cfg = loadConfig(process.argv[2]);
  // A failing websocket or a late rejection must not end the run without the steps' lines.
  process.on('uncaughtException', (error) => log(`uncaught exception: ${error?.stack ?? error}`));
  process.on('unhandledRejection', (error) => log(`unhandled rejection: ${error?.stack ?? error}`));

  const unknown = cfg.steps.filter((s) => !kAllSteps.includes(s));
  let allOk = true;
  for (const name of unknown) {
    const error = `unknown step (known: ${kAllSteps.join(', ')})`;
    process.stdout.write(toJson({step: name, ok: false, error}) + '\n');
    allOk = false;
  }
  for (const name of kAllSteps) {
    if (!cfg.steps.includes(name)) continue;
    const started = Date.now();
    const out = {};
    let line;
    try {
      // vote puts a timeout on each voter instead.
      const run = steps[name](cfg, out);
      await (name === 'vote' ? run : withTimeout(run, cfg.step_timeout_ms, `step ${name}`));
      line = {step: name, ok: true, ...out};
    } catch (error) {
      line = {step: name, ok: false, error: errorText(error), ...out};
      if (!(error instanceof CheckFailure)) log(`step ${name}: ${error?.stack ?? error}`);
      allOk = false;
    }
    line.seconds = Math.round((Date.now() - started) / 100) / 10;
    process.stdout.write(toJson(line) + '\n');
  }
  return allOk;
}

main().then(
    (ok) => process.exit(ok ? 0 : 1),
    (error) => {
      log(`fatal: ${error?.stack ?? error}`);
      process.exit(1);
    });
