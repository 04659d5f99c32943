// `trainshard host status|shards|events|settlement`: what one host sidecar knows and did, from
// its operator API.
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/hex.h"
#include "sidecar/cli/commands.h"
#include "sidecar/cli/host_client.h"
#include "sidecar/cli/output.h"
#include "sidecar/cli/parse.h"

namespace ts::sidecar {
namespace pb = ::gonka::trainshard::v1;
namespace {

// ListEvents pages, and the most events one invocation collects.
constexpr uint32_t kEventsPageSize = 500;
constexpr size_t kEventsMax = 1000000;

std::string Peer(const std::string& endpoint) { return "host " + endpoint; }

// "2026-01-02T03:04:05Z" for a unix-ms time.
std::string UtcTime(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixMillis(unix_ms), absl::UTCTimeZone());
}

// "following", or since when and why not.
std::string FollowerState(const pb::HostStatusResponse& status) {
  if (status.follower_error().empty()) return "following";
  return absl::StrCat("stopped since ", UtcTime(status.follower_error_since_unix_ms()), ": ",
                      status.follower_error());
}

// "writable", or since when and why the records refuse writes.
std::string RecordsState(const pb::HostStatusResponse& status) {
  if (status.records_error().empty()) return "writable";
  return absl::StrCat("refusing writes since ", UtcTime(status.records_error_since_unix_ms()), ": ",
                      status.records_error());
}

int RunStatus(Context& ctx, const std::string& host_text) {
  auto endpoint = ParseHostTarget("--host", host_text);
  if (!endpoint.ok()) return ctx.BadInput(endpoint.status());
  HostClient host(*endpoint, ctx.options().timeout_ms);
  auto status = host.Status();
  if (!status.ok()) return ctx.PeerFailed(Peer(*endpoint), status.status());
  if (ctx.json()) {
    ctx.PrintProtoJson(*status);
    return kExitOk;
  }
  PrintKeyValues(ctx.out(), {{"address", status->address()},
                             {"chain_id", status->chain_id()},
                             {"cursor_height", std::to_string(status->cursor_height())},
                             {"chain_height", std::to_string(status->chain_height())},
                             {"pending_txs", std::to_string(status->pending_txs())},
                             {"events_processed", std::to_string(status->events_processed())},
                             {"current_weight", std::to_string(status->current_weight())},
                             {"version", status->version()},
                             {"follower", FollowerState(*status)},
                             {"records", RecordsState(*status)},
                             {"records_path", status->records_path()},
                             {"records_recoveries", std::to_string(status->records_recoveries())}});
  if (status->run_starts_size() > 0) {
    std::vector<std::vector<std::string>> rows;
    for (const pb::RunStartStatus& r : status->run_starts()) {
      const std::string state = r.started()                ? "started"
                                : r.waiting_for_operator() ? "operator's shard run"
                                                           : "retrying";
      rows.push_back(
          {std::to_string(r.shard_id()), state, std::to_string(r.attempts()), r.last_error()});
    }
    ctx.out() << "\n";
    PrintTable(ctx.out(), {"SHARD", "RUN", "ATTEMPTS", "LAST_ERROR"}, rows);
  }
  return kExitOk;
}

int RunShards(Context& ctx, const std::string& host_text) {
  auto endpoint = ParseHostTarget("--host", host_text);
  if (!endpoint.ok()) return ctx.BadInput(endpoint.status());
  HostClient host(*endpoint, ctx.options().timeout_ms);
  auto shards = host.ListShards();
  if (!shards.ok()) return ctx.PeerFailed(Peer(*endpoint), shards.status());
  if (ctx.json()) {
    ctx.PrintProtoJson(*shards);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& s : shards->shards()) {
    std::string reservation = s.reserved() ? "reserved" : s.reservation_sent() ? "sent" : "-";
    rows.push_back({std::to_string(s.shard_id()),
                    ShortEnumName(pb::ShardStatus_Name(s.status()), "SHARD_STATUS_"),
                    s.hardware_profile(), reservation, std::to_string(s.frozen_weight()),
                    absl::StrCat(s.members_size(), "/", s.max_nodes()),
                    s.settlement_signed() ? "signed" : "-", s.skip_reason()});
  }
  PrintTable(ctx.out(),
             {"ID", "STATUS", "PROFILE", "RESERVATION", "WEIGHT", "MEMBERS", "SETTLEMENT", "SKIP"},
             rows);
  return kExitOk;
}

struct EventsArgs {
  std::string host;
  int64_t from = 0;
};

int RunEvents(Context& ctx, const EventsArgs& args) {
  auto endpoint = ParseHostTarget("--host", args.host);
  if (!endpoint.ok()) return ctx.BadInput(endpoint.status());
  if (args.from < 0) {
    return ctx.BadInput(absl::InvalidArgumentError(
        absl::StrCat("--from ", args.from, ": heights are not negative")));
  }
  HostClient host(*endpoint, ctx.options().timeout_ms);
  std::vector<pb::FollowedEvent> events;
  int64_t from = args.from;
  // ListEvents returns events from `from_height` (inclusive) on, up to a limit. Pages restart at
  // the height of the last event seen, so events already collected are skipped by
  // (height, index) whichever way the sidecar cuts its pages; the end is a page with nothing new.
  bool any = false;
  int64_t last_height = 0;
  uint32_t last_index = 0;
  while (true) {
    auto page = host.ListEvents(from, kEventsPageSize);
    if (!page.ok()) return ctx.PeerFailed(Peer(*endpoint), page.status());
    size_t fresh = 0;
    for (const auto& e : page->events()) {
      bool seen = any && (e.height() < last_height ||
                          (e.height() == last_height && e.index() <= last_index));
      if (seen) continue;
      events.push_back(e);
      any = true;
      last_height = e.height();
      last_index = e.index();
      ++fresh;
    }
    if (events.size() >= kEventsMax) {
      ctx.err() << "warning: stopped after " << events.size() << " events; use --from "
                << last_height << " for more\n";
      break;
    }
    if (fresh > 0) {
      from = last_height;
      continue;
    }
    // Nothing new. A sidecar may cap pages below what was asked, so only an empty or short
    // page of old events means the end; a full one means one height holds more events than a
    // page: move past it rather than ask for the same page again.
    if (static_cast<uint32_t>(page->events_size()) < kEventsPageSize) break;
    ctx.err() << "warning: height " << last_height << " has more than " << kEventsPageSize
              << " events; some were not listed\n";
    from = last_height + 1;
  }
  if (ctx.json()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& e : events) {
      nlohmann::ordered_json item = EventToJson(e.height(), e.index(), e.event());
      item["action"] = e.action();
      list.push_back(std::move(item));
    }
    ctx.PrintJson({{"events", std::move(list)}});
    return kExitOk;
  }
  for (const auto& e : events) {
    ctx.out() << EventLine(e.height(), e.index(), e.event()) << "  -> " << e.action() << "\n";
  }
  return kExitOk;
}

struct SettlementArgs {
  std::string host;
  uint64_t id = 0;
};

int RunSettlement(Context& ctx, const SettlementArgs& args) {
  auto endpoint = ParseHostTarget("--host", args.host);
  if (!endpoint.ok()) return ctx.BadInput(endpoint.status());
  HostClient host(*endpoint, ctx.options().timeout_ms);
  auto response = host.GetSettlement(args.id);
  if (!response.ok()) return ctx.PeerFailed(Peer(*endpoint), response.status());
  if (ctx.json()) {
    ctx.PrintProtoJson(*response);
    return kExitOk;
  }
  PrintSettlement(ctx.out(), response->settlement());
  ctx.out() << "\n";
  PrintKeyValues(ctx.out(), {{"signed_by", response->signature().host()},
                             {"signature", common::HexEncode(response->signature().signature())}});
  return kExitOk;
}

}  // namespace

void AddHostCommands(CLI::App& root, CommandTable& table) {
  CLI::App* host = root.add_subcommand("host", "a host sidecar's operator API");
  host->require_subcommand(1);
  const std::string host_help = kHostFlagHelp;

  auto status_host = std::make_shared<std::string>();
  CLI::App* status = host->add_subcommand("status", "the sidecar's address, cursor and queue");
  status->add_option("--host", *status_host, host_help)->required();
  table.Add(status, [status_host](Context& ctx) { return RunStatus(ctx, *status_host); });

  auto shards_host = std::make_shared<std::string>();
  CLI::App* shards = host->add_subcommand("shards", "the shards the sidecar knows");
  shards->add_option("--host", *shards_host, host_help)->required();
  table.Add(shards, [shards_host](Context& ctx) { return RunShards(ctx, *shards_host); });

  auto events_args = std::make_shared<EventsArgs>();
  CLI::App* events = host->add_subcommand("events", "chain events the sidecar followed");
  events->add_option("--host", events_args->host, host_help)->required();
  events->add_option("--from", events_args->from, "first height (default: all)")
      ->transform(UnsignedInteger());
  table.Add(events, [events_args](Context& ctx) { return RunEvents(ctx, *events_args); });

  auto settlement_args = std::make_shared<SettlementArgs>();
  CLI::App* settlement =
      host->add_subcommand("settlement", "the settlement draft the sidecar signed for a shard");
  settlement->add_option("--host", settlement_args->host, host_help)->required();
  settlement->add_option("--id", settlement_args->id, "shard id")
      ->transform(UnsignedInteger())
      ->required();
  table.Add(settlement,
            [settlement_args](Context& ctx) { return RunSettlement(ctx, *settlement_args); });
}

}  // namespace ts::sidecar
