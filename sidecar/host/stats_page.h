// The stats page's assets (sidecar/host/stats_page/: index.html, stats.css, stats.js), built
// into trainshardd by cmake/embed_files.cmake so the daemon serves them without files on disk,
// a CDN or any network beyond the host itself.
//
// Thread-safety: immutable data; thread-safe.
#ifndef TS_SIDECAR_HOST_STATS_PAGE_H_
#define TS_SIDECAR_HOST_STATS_PAGE_H_

#include <span>
#include <string_view>

namespace ts::sidecar {

struct EmbeddedFile {
  std::string_view path;  // where it is served: "/index.html", "/stats.js", ...
  std::string_view body;
};

std::span<const EmbeddedFile> StatsPageFiles();

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_HOST_STATS_PAGE_H_
