// The live stats page of trainshardd: polls GET api/v1/overview every 2 s and renders it.
//
// The overview is proto3 JSON (snake_case names, every field present, 64-bit integers as
// strings, bytes as base64, enums by name); any field may still be missing or null, and the page
// renders what it has. Text from the daemon only ever reaches the page through text nodes and
// attribute values, never as markup.
//
// Each poll builds a fresh DOM tree for each region and morphs the live tree into it (morph()
// below): elements that stay keep their identity, so keyboard focus, the scroll position of a
// table, and an opened <details> survive every update.
//
// Failures of the poll itself (the daemon down, an HTTP error, a bad body) are expected and
// shown as the connection state, never thrown or logged. A failure to render is a bug of this
// page and is logged with console.error.
'use strict';

(function () {
  const kApiPath = 'api/v1/overview';
  const kPollMs = 2000;
  const kFetchTimeoutMs = 8000;
  const kShardStates = ['PROPOSED', 'OPEN', 'RUNNING', 'SETTLED', 'EXPIRED', 'REJECTED'];
  const kSvgNs = 'http://www.w3.org/2000/svg';
  // Points drawn as dots up to this many; beyond, the line alone.
  const kDotsMax = 48;
  // The chain's shards only grow in number: the table shows the newest this many.
  const kChainShardsShown = 100;

  // ------------------------------------------------------------------------------------------
  // Building DOM trees

  function append(node, child) {
    if (child === null || child === undefined || child === false) return;
    if (Array.isArray(child)) {
      for (const c of child) append(node, c);
      return;
    }
    node.appendChild(typeof child === 'object' ? child : document.createTextNode(String(child)));
  }

  function setAttrs(node, attrs) {
    if (!attrs) return;
    for (const name of Object.keys(attrs)) {
      const value = attrs[name];
      if (value === null || value === undefined || value === false) continue;
      node.setAttribute(name, value === true ? '' : String(value));
    }
  }

  // h('td', {class: 'num'}, 'text', child, [more]): an HTML element.
  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  // An SVG element.
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(kSvgNs, tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  // ------------------------------------------------------------------------------------------
  // Morphing the live tree into a fresh one

  // Attributes the reader changes, which an update must leave as they are.
  function keepsAttr(node, name) {
    return node.nodeName === 'DETAILS' && name === 'open';
  }

  function keyOf(node) {
    return node.nodeType === 1 ? node.getAttribute('data-key') : null;
  }

  function sameKind(a, b) {
    return a.nodeType === b.nodeType && a.nodeName === b.nodeName;
  }

  function morphNode(live, fresh) {
    if (live.nodeType === 3 || live.nodeType === 8) {
      if (live.nodeValue !== fresh.nodeValue) live.nodeValue = fresh.nodeValue;
      return;
    }
    for (const attr of Array.from(live.attributes)) {
      if (!fresh.hasAttribute(attr.name) && !keepsAttr(live, attr.name)) {
        live.removeAttribute(attr.name);
      }
    }
    for (const attr of Array.from(fresh.attributes)) {
      if (keepsAttr(live, attr.name)) continue;
      if (live.getAttribute(attr.name) !== attr.value) live.setAttribute(attr.name, attr.value);
    }
    morphChildren(live, fresh);
  }

  // Children are matched by data-key where they have one, else by position and kind.
  function morphChildren(live, fresh) {
    const keyed = new Map();
    for (const child of Array.from(live.childNodes)) {
      const key = keyOf(child);
      if (key !== null) keyed.set(key, child);
    }
    let cursor = live.firstChild;
    for (const next of Array.from(fresh.childNodes)) {
      const key = keyOf(next);
      let match = null;
      if (key !== null) {
        const candidate = keyed.get(key);
        if (candidate && sameKind(candidate, next)) match = candidate;
        keyed.delete(key);
      } else if (cursor && keyOf(cursor) === null && sameKind(cursor, next)) {
        match = cursor;
      }
      if (match === null) {
        live.insertBefore(next, cursor);
        continue;
      }
      if (match === cursor) {
        cursor = cursor.nextSibling;
      } else {
        live.insertBefore(match, cursor);
      }
      morphNode(match, next);
    }
    // Everything from the cursor on was matched by nothing.
    while (cursor) {
      const gone = cursor;
      cursor = cursor.nextSibling;
      live.removeChild(gone);
    }
  }

  // Makes the children of `live` those of the fresh element `fresh` (same tag).
  function morphInto(live, fresh) {
    morphChildren(live, fresh);
  }

  // ------------------------------------------------------------------------------------------
  // Reading proto3 JSON values

  function isObject(v) {
    return v !== null && typeof v === 'object' && !Array.isArray(v);
  }

  function obj(v) {
    return isObject(v) ? v : {};
  }

  function list(v) {
    return Array.isArray(v) ? v : [];
  }

  function str(v) {
    return typeof v === 'string' ? v : v === null || v === undefined ? '' : String(v);
  }

  // A number from a JSON number or a 64-bit integer string; null where there is none.
  function num(v) {
    if (v === null || v === undefined || v === '') return null;
    const n = typeof v === 'number' ? v : Number(v);
    return Number.isFinite(n) ? n : null;
  }

  function big(v) {
    if (typeof v === 'number' && Number.isInteger(v)) return BigInt(v);
    if (typeof v === 'string' && /^-?\d+$/.test(v.trim())) return BigInt(v.trim());
    return null;
  }

  function enumName(v, prefix) {
    const s = str(v);
    return s.startsWith(prefix) ? s.slice(prefix.length) : s;
  }

  function base64ToHex(v) {
    const s = str(v);
    if (!s) return '';
    try {
      const bin = atob(s.replace(/-/g, '+').replace(/_/g, '/'));
      let hex = '';
      for (let i = 0; i < bin.length; ++i) hex += bin.charCodeAt(i).toString(16).padStart(2, '0');
      return hex;
    } catch (e) {
      return '';
    }
  }

  // ------------------------------------------------------------------------------------------
  // Formatting

  const kDash = '—';
  const intFormat = new Intl.NumberFormat('en-US', {maximumFractionDigits: 0});

  function fmtInt(v) {
    const b = big(v);
    if (b !== null) return b.toLocaleString('en-US');
    const n = num(v);
    return n === null ? kDash : intFormat.format(n);
  }

  function fmtLoss(v) {
    const n = num(v);
    return n === null ? kDash : n.toFixed(4);
  }

  // Loss × 1e6 (an int64 string) as a loss; 0 means none.
  function lossOfMicro(v) {
    const n = num(v);
    return n === null || n === 0 ? null : n / 1e6;
  }

  function fmtBytes(v) {
    const n = num(v);
    if (n === null) return kDash;
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let value = n;
    let unit = 0;
    while (Math.abs(value) >= 1024 && unit < units.length - 1) {
      value /= 1024;
      ++unit;
    }
    return unit === 0 ? `${value} B` : `${value.toFixed(value < 10 ? 2 : 1)} ${units[unit]}`;
  }

  function byteUnit(max) {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let k = 0;
    while (k < units.length - 1 && max >= Math.pow(1024, k + 1)) ++k;
    return {name: units[k], size: Math.pow(1024, k)};
  }

  function fmtSeconds(v) {
    const n = num(v);
    if (n === null) return kDash;
    if (n < 60) return `${n.toFixed(n < 10 ? 2 : 1)} s`;
    const minutes = Math.floor(n / 60);
    if (minutes < 60) return `${minutes} min ${Math.round(n - minutes * 60)} s`;
    return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
  }

  function fmtPercent(part, whole) {
    const p = num(part);
    const w = num(whole);
    if (p === null || w === null || w === 0) return kDash;
    return `${((100 * p) / w).toFixed(1)} %`;
  }

  function fmtNgonka(v) {
    const b = big(v);
    return b === null ? kDash : `${b.toLocaleString('en-US')} ngonka`;
  }

  function fmtTime(unixMs) {
    const n = num(unixMs);
    if (n === null || n === 0) return '';
    return new Date(n).toLocaleTimeString('en-GB', {hour12: false});
  }

  function shortAddress(a) {
    const s = str(a);
    return s.length > 20 ? `${s.slice(0, 10)}…${s.slice(-6)}` : s;
  }

  function shortHex(hex, chars) {
    return hex ? hex.slice(0, chars) : kDash;
  }

  function plural(n, one, many) {
    return `${n} ${n === 1 ? one : many}`;
  }

  // Pieces of markup used everywhere ---------------------------------------------------------

  function address(a, self) {
    const s = str(a);
    if (!s) return h('span', {class: 'muted'}, kDash);
    return h('span', {class: 'address'},
             h('code', {class: 'addr-full'}, s),
             h('code', {class: 'addr-short'}, shortAddress(s)),
             s === self ? h('span', {class: 'tag tag-self'}, 'this host') : null);
  }

  function statusBadge(v) {
    const name = enumName(v, 'SHARD_STATUS_') || 'UNSPECIFIED';
    return h('span', {class: `badge badge-${name.toLowerCase()}`}, name.toLowerCase());
  }

  function runBadge(state) {
    const s = str(state) || 'unknown';
    return h('span', {class: `badge run-${s.replace(/[^a-z_]/g, '')}`}, s.replace(/_/g, ' '));
  }

  function stat(label, value, opts) {
    const o = opts || {};
    return h('div', {class: `stat${o.wide ? ' stat-wide' : ''}${o.warn ? ' stat-warn' : ''}`},
             h('dt', null, label), h('dd', null, value));
  }

  // Tiles of label and value (a <dl>; the heading above names them).
  function stats(items) {
    return h('dl', {class: 'stats'}, items);
  }

  // A table in its own horizontally scrolling, keyboard-reachable container, its caption for
  // screen readers (the h3 above names it on screen). columns: [{label, num: right-aligned,
  // wrap: long text that wraps}]; rows: [{key, class, cells: [node or text]}]; the first cell
  // of a row is its header.
  function table(id, caption, columns, rows, opts) {
    const o = opts || {};
    const captionId = `${id}-caption`;
    const head = h('thead', null, h('tr', null, columns.map(
        (c) => h('th', {scope: 'col', class: c.num ? 'num' : null}, c.label))));
    const body = h('tbody', null, rows.map((row) => h(
        'tr', {'data-key': row.key, class: row.class || null}, row.cells.map((cell, i) => {
          const c = columns[i] || {};
          const cls = c.num ? 'num' : c.wrap ? 'wrap' : null;
          return i === 0
              ? h('th', {scope: 'row', class: cls}, cell)
              : h('td', {class: cls}, cell);
        }))));
    const t = h('table', {id, 'data-table': o.name || null},
                h('caption', {id: captionId, class: 'visually-hidden'}, caption),
                head, body);
    return h('div', {class: 'table-wrap', role: 'region', tabindex: '0',
                     'aria-labelledby': captionId}, t);
  }

  function placeholder(text) {
    return h('p', {class: 'placeholder'}, text);
  }

  function notice(text, kind) {
    return h('p', {class: `notice notice-${kind || 'warn'}`}, text);
  }

  // ------------------------------------------------------------------------------------------
  // Charts: inline SVG line charts sized to their container (so text keeps its size).

  function niceStep(range, count) {
    const raw = range / Math.max(1, count);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const norm = raw / mag;
    const step = norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10;
    return step * mag;
  }

  function ticks(lo, hi, count) {
    const step = niceStep(hi - lo, count);
    const first = Math.ceil(lo / step) * step;
    const out = [];
    for (let i = 0; first + i * step <= hi + step * 1e-9; ++i) {
      const v = first + i * step;
      out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    }
    return {step, values: out};
  }

  const kChartMargin = {l: 54, r: 18, t: 16, b: 36};

  // Where points go in a chart of W × H: the axes' ranges, ticks and the mapping to pixels.
  // zero: the y axis starts at 0 (or below).
  function chartScale(points, W, H, zero) {
    const m = kChartMargin;
    const iw = W - m.l - m.r;
    const ih = H - m.t - m.b;
    const xs = points.map((p) => p.x);
    const ys = points.map((p) => p.y);
    let x0 = Math.min(...xs);
    let x1 = Math.max(...xs);
    if (x0 === x1) {
      x0 -= 1;
      x1 += 1;
    }
    let y0 = zero ? Math.min(0, ...ys) : Math.min(...ys);
    let y1 = Math.max(...ys);
    if (y1 === y0) {
      const pad = Math.max(Math.abs(y0) * 0.05, 0.01);
      y0 -= zero && y0 === 0 ? 0 : pad;
      y1 += pad;
    }
    // The axis runs from tick to tick, so both its ends are labelled.
    const yCount = H < 220 ? 4 : 5;
    const step = niceStep(y1 - y0, yCount);
    y0 = Math.floor(y0 / step + 1e-9) * step;
    y1 = Math.ceil(y1 / step - 1e-9) * step;
    return {
      W, H, iw, ih,
      yt: ticks(y0, y1, yCount),
      xt: ticks(x0, x1, Math.max(2, Math.floor(iw / 70))),
      xOf: (x) => m.l + ((x - x0) / (x1 - x0)) * iw,
      yOf: (y) => m.t + ih - ((y - y0) / (y1 - y0)) * ih,
    };
  }

  function chartAxes(sc, axisFormat) {
    const m = kChartMargin;
    const bottom = m.t + sc.ih;
    const out = [];
    for (const v of sc.yt.values) {
      const y = sc.yOf(v).toFixed(1);
      out.push(svg('line', {x1: m.l, x2: sc.W - m.r, y1: y, y2: y, class: 'grid'}));
      out.push(svg('text', {x: m.l - 8, y, class: 'tick', 'text-anchor': 'end',
                            'dominant-baseline': 'middle'}, axisFormat(v, sc.yt.step)));
    }
    for (const v of sc.xt.values) {
      if (!Number.isInteger(v)) continue;  // rounds are whole
      const x = sc.xOf(v).toFixed(1);
      out.push(svg('line', {x1: x, x2: x, y1: bottom, y2: bottom + 5, class: 'axis'}));
      out.push(svg('text', {x, y: bottom + 19, class: 'tick', 'text-anchor': 'middle'},
                   String(v)));
    }
    out.push(svg('line', {x1: m.l, x2: sc.W - m.r, y1: bottom, y2: bottom, class: 'axis'}));
    out.push(svg('text', {x: sc.W - m.r, y: sc.H - 3, class: 'axis-label',
                          'text-anchor': 'end'}, 'round'));
    return svg('g', {'aria-hidden': 'true'}, out);
  }

  function chartSeries(sc, points) {
    const n = points.length;
    const at = (p) => `${sc.xOf(p.x).toFixed(1)},${sc.yOf(p.y).toFixed(1)}`;
    const coords = points.map(at);
    const base = (kChartMargin.t + sc.ih).toFixed(1);
    const area = `M${sc.xOf(points[0].x).toFixed(1)},${base} L${coords.join(' L')} ` +
                 `L${sc.xOf(points[n - 1].x).toFixed(1)},${base} Z`;
    const last = points[n - 1];
    return svg('g', {'aria-hidden': 'true'},
               svg('path', {d: area, class: 'area'}),
               svg('polyline', {points: coords.join(' '), class: 'line'}),
               n <= kDotsMax
                   ? svg('g', {class: 'dots'}, points.map((p) => svg(
                         'circle', {cx: sc.xOf(p.x).toFixed(1), cy: sc.yOf(p.y).toFixed(1), r: 3,
                                    class: 'dot'})))
                   : null,
               svg('circle', {cx: sc.xOf(last.x).toFixed(1), cy: sc.yOf(last.y).toFixed(1),
                              r: 4.5, class: 'last-dot'}));
  }

  // What a screen reader hears for the chart.
  function chartSummary(title, points, format) {
    const n = points.length;
    if (n === 0) return `${title}: no points yet.`;
    const last = points[n - 1];
    let low = points[0];
    for (const p of points) if (p.y < low.y) low = p;
    return `${title}: ${plural(n, 'point', 'points')}, rounds ${points[0].x} to ${last.x}; ` +
           `first ${format(points[0].y)}, latest ${format(last.y)}, ` +
           `lowest ${format(low.y)} at round ${low.x}.`;
  }

  // A line chart of points [{x: round, y}] sorted by x, as an inline <svg role="img"> whose
  // data-points is the number of points, with its values in a table under a <details>.
  // spec: id, name (data-chart), series (colour), title, valueLabel, points, format (a y as
  // text), axisFormat (a tick and the step between ticks as text), width (px), zero.
  function lineChart(spec) {
    const {id, name, title, points, format, series} = spec;
    const W = Math.max(240, Math.round(spec.width));
    const H = W < 420 ? 200 : 230;
    const n = points.length;
    const titleId = `${id}-title`;
    let body;
    if (n === 0) {
      body = [svg('text', {x: W / 2, y: H / 2, class: 'chart-empty', 'text-anchor': 'middle'},
                  'No data yet')];
    } else {
      const sc = chartScale(points, W, H, spec.zero);
      body = [chartAxes(sc, spec.axisFormat), chartSeries(sc, points)];
    }
    const chart = svg('svg', {
      class: `chart series-${series}`, viewBox: `0 0 ${W} ${H}`, width: '100%', role: 'img',
      'aria-label': chartSummary(title, points, format), 'data-chart': name, 'data-points': n,
      preserveAspectRatio: 'xMidYMid meet', focusable: 'false',
    }, body);
    const values = h('details', {class: 'chart-values'},
                     h('summary', null, `${title}: table of values`),
                     table(`${id}-values`, `${title} by round`,
                           [{label: 'Round', num: true}, {label: spec.valueLabel, num: true}],
                           points.slice().reverse().map((p) => ({
                             key: String(p.x), cells: [String(p.x), format(p.y)],
                           }))));
    return h('figure', {class: 'chart-figure', id, 'data-key': id, 'aria-labelledby': titleId},
             h('figcaption', {id: titleId, class: 'chart-title'},
               h('span', {class: 'chart-name'},
                 h('span', {class: `swatch series-${series}`, 'aria-hidden': 'true'}), title),
               h('span', {class: 'chart-latest'},
                 n ? [h('span', {class: 'chart-latest-value'}, format(points[n - 1].y)),
                      ` at round ${points[n - 1].x} · `] : null,
                 plural(n, 'point', 'points'))),
             chart, values);
  }

  // The width a chart gets: what its figure had last time, or an estimate from the page's.
  function chartWidth(id) {
    const figure = document.getElementById(id);
    const chart = figure ? figure.querySelector('svg.chart') : null;
    const drawn = chart ? chart.getBoundingClientRect().width : 0;
    if (drawn > 0) return drawn;
    const main = document.getElementById('main');
    const w = main ? main.clientWidth : 800;
    const inner = w - (w < 600 ? 34 : 58);
    return inner >= 760 ? (inner - 16) / 2 : inner;
  }

  // ------------------------------------------------------------------------------------------
  // Host

  function renderHost(o) {
    if (!isObject(o.host) && str(o.host_error)) {
      return [notice(`The host's status could not be read: ${str(o.host_error)}`)];
    }
    const host = obj(o.host);
    const self = str(host.address);
    const chainHeight = num(host.chain_height);
    const cursor = num(host.cursor_height);
    const lag = chainHeight !== null && cursor !== null ? chainHeight - cursor : null;
    const lagText = lag === null ? kDash
                  : lag <= 0 ? 'in step with the chain'
                  : `${plural(lag, 'block', 'blocks')} behind`;
    const out = [];
    out.push(stats([
      stat('Address', self ? h('code', {class: 'break'}, self) : kDash, {wide: true}),
      stat('Chain', str(host.chain_id) || kDash),
      stat('Chain height', fmtInt(host.chain_height)),
      stat('Followed to', fmtInt(host.cursor_height)),
      stat('Lag', lagText, {warn: lag !== null && lag > 5}),
      stat('Weight', fmtInt(host.current_weight)),
      stat('Pending transactions', fmtInt(host.pending_txs)),
      stat('Events processed', fmtInt(host.events_processed)),
      stat('Version', str(host.version) || kDash),
    ]));
    if (str(host.follower_error)) {
      const since = fmtTime(host.follower_error_since_unix_ms);
      out.push(notice(`The chain follower is failing${since ? ` since ${since}` : ''}: ` +
                      str(host.follower_error)));
    }
    if (str(host.records_error)) {
      const since = fmtTime(host.records_error_since_unix_ms);
      out.push(notice(`The records database refuses writes${since ? ` since ${since}` : ''}: ` +
                      str(host.records_error)));
    }
    const starts = list(host.run_starts);
    if (starts.length > 0) {
      out.push(h('h3', null, 'Runs this host starts'));
      out.push(table('run-starts', 'Runs this host starts from the run spec on chain', [
        {label: 'Shard', num: true}, {label: 'State'}, {label: 'Attempts', num: true},
        {label: 'Last error', wrap: true},
      ], starts.map((s0) => {
        const s = obj(s0);
        const state = s.started ? 'started' : s.waiting_for_operator ? 'waiting for the operator'
                                                                     : 'starting';
        return {key: str(s.shard_id), cells: [fmtInt(s.shard_id), state, fmtInt(s.attempts),
                                              str(s.last_error) || kDash]};
      })));
    }
    return out;
  }

  // ------------------------------------------------------------------------------------------
  // Network

  function networkStates(shards, total) {
    const counts = {};
    for (const s of shards) {
      const name = enumName(s.status, 'SHARD_STATUS_') || 'UNSPECIFIED';
      counts[name] = (counts[name] || 0) + 1;
    }
    const states = kShardStates.concat(Object.keys(counts).filter((k) => !kShardStates.includes(k)));
    return [
      h('h3', {id: 'network-states-title'}, shards.length < total
          ? `Shards by state (the newest ${shards.length})` : 'Shards by state'),
      h('ul', {class: 'state-counts', 'aria-labelledby': 'network-states-title'},
        states.map((name) => h(
            'li', {class: `state-count${counts[name] ? '' : ' zero'}`, 'data-key': name},
            h('span', {class: `badge badge-${name.toLowerCase()}`}, name.toLowerCase()),
            h('span', {class: 'count'}, String(counts[name] || 0))))),
    ];
  }

  function networkShards(shards, total, shardIds) {
    const out = [h('h3', null, `Shards on chain (${total})`)];
    if (shards.length === 0) {
      out.push(placeholder('The chain has no shards.'));
      return out;
    }
    const shown = shards.slice().sort((a, b) => (num(b.id) || 0) - (num(a.id) || 0))
        .slice(0, kChainShardsShown);
    if (shown.length < total) {
      out.push(h('p', {class: 'summary-line muted'},
                 `The newest ${shown.length} of ${total} shards.`));
    }
    out.push(table('network-shards', `Shards on chain (${total})`, [
      {label: 'Shard', num: true}, {label: 'State'}, {label: 'Hardware'},
      {label: 'Hosts', num: true}, {label: 'Weight', num: true},
      {label: 'Escrow held (ngonka)', num: true},
      {label: 'Deadline height', num: true}, {label: 'Closed'},
    ], shown.map((s) => {
      const spec = obj(s.spec);
      const id = str(s.id);
      const reason = enumName(s.close_reason, 'CLOSE_REASON_');
      const why = reason && reason !== 'UNSPECIFIED'
          ? ` (${reason.toLowerCase().replace(/_/g, ' ')})` : '';
      return {key: id, cells: [
        shardIds.has(id) ? h('a', {href: `#shard-${cssId(id)}`}, `#${id}`) : `#${id}`,
        statusBadge(s.status), str(spec.hardware_profile) || kDash,
        `${list(s.reservations).length} of ${fmtInt(spec.min_nodes)}–${fmtInt(spec.max_nodes)}`,
        fmtInt(s.total_weight), fmtInt(s.escrow_held), fmtInt(s.deadline_height),
        num(s.closed_height) ? `at ${fmtInt(s.closed_height)}${why}` : kDash,
      ]};
    }), {name: 'network-shards'}));
    return out;
  }

  function networkHosts(shards, weights, self) {
    // How many of the listed shards each host holds a reservation in.
    const reservedIn = new Map();
    for (const s of shards) {
      for (const r of list(s.reservations)) {
        const who = str(obj(r).host);
        reservedIn.set(who, (reservedIn.get(who) || 0) + 1);
      }
    }
    const hosts = list(weights.weights).map(obj)
        .sort((a, b) => (num(b.weight) || 0) - (num(a.weight) || 0));
    const epoch = weights.epoch !== undefined && weights.epoch !== null
        ? `, epoch ${fmtInt(weights.epoch)}` : '';
    const title = `Hosts and their weight (${hosts.length}${epoch})`;
    if (hosts.length === 0) {
      return [h('h3', null, title), placeholder('The chain lists no host weights.')];
    }
    const total = num(weights.total_weight) ||
                  hosts.reduce((sum, w) => sum + (num(w.weight) || 0), 0);
    return [h('h3', null, title), table('network-hosts', title, [
      {label: 'Host'}, {label: 'Weight', num: true}, {label: 'Share', num: true},
      {label: 'Shards reserved', num: true},
    ], hosts.map((w) => ({
      key: str(w.host),
      class: str(w.host) === self ? 'self' : null,
      cells: [address(w.host, self), fmtInt(w.weight), fmtPercent(w.weight, total),
              String(reservedIn.get(str(w.host)) || 0)],
    })), {name: 'network-hosts'})];
  }

  function renderNetwork(o, self, shardIds) {
    if (!isObject(o.network)) {
      const why = str(o.network_error);
      return [notice(why ? `The chain could not be read: ${why}` : 'The chain could not be read.')];
    }
    const shards = list(o.network.shards).filter(isObject);
    // The daemon lists the newest shards and says how many there are in all.
    const total = Math.max(num(o.network.shards_total) || 0, shards.length);
    return [
      networkStates(shards, total),
      networkShards(shards, total, shardIds),
      networkHosts(shards, obj(o.network.weights), self),
    ];
  }

  function cssId(id) {
    return str(id).replace(/[^A-Za-z0-9_-]/g, '_');
  }

  // ------------------------------------------------------------------------------------------
  // Shards

  // Joins, leaves and rejoins, from the members of consecutive certified rounds this host took
  // part in.
  function membershipEvents(rounds) {
    const events = [];
    const seen = new Set();
    let prev = null;
    let prevRound = null;
    for (const r of rounds) {
      const members = list(r.members).map(str);
      const current = new Set(members);
      if (prev === null) {
        for (const m of members) seen.add(m);
      } else {
        for (const m of prev) {
          if (!current.has(m)) events.push({round: r.round, kind: 'left', host: m});
        }
        for (const m of members) {
          if (prev.has(m)) continue;
          events.push({round: r.round, kind: seen.has(m) ? 'rejoined' : 'joined', host: m});
          seen.add(m);
        }
        if (r.round - prevRound > 1) {
          events.push({round: r.round, kind: 'gap', from: prevRound + 1, to: r.round - 1});
        }
      }
      prev = current;
      prevRound = r.round;
    }
    return events;
  }

  // Keys for lines that may repeat: the text and how many times it came before.
  function keyByOccurrence(lines) {
    const seen = new Map();
    return lines.map((text) => {
      const n = seen.get(text) || 0;
      seen.set(text, n + 1);
      return {key: `${n}:${text}`, text};
    });
  }

  function transitionClass(text) {
    if (/fail|error|refused|timed out|timeout|gave up|not run|died|restart/i.test(text)) {
      return 'transition warn';
    }
    if (/join|left|leave|dropped|rejoin|caught up|without this host/i.test(text)) {
      return 'transition member';
    }
    return 'transition';
  }

  // What the parts of a shard's section read, taken from its overview entry once.
  function shardView(entry, self, chainShards) {
    const record = obj(entry.record);
    const run = isObject(entry.run) ? entry.run : null;
    const id = str(shardIdOf(entry));
    const members = list(record.members).map(obj).filter((m) => str(m.host));
    const rounds = run ? list(run.rounds).filter(isObject).map((r) => Object.assign({}, r, {
      round: num(r.round) || 0,
    })).sort((a, b) => a.round - b.round) : [];
    const settlementRecord = isObject(entry.settlement) ? entry.settlement : null;
    const onChain = settlementRecord ? obj(settlementRecord.settlement) : null;
    return {
      entry, record, run, id, self, rounds, members, settlementRecord, onChain,
      sid: cssId(id),
      chain: chainShards.get(id) || null,
      totalWeight: num(record.total_weight) ||
                   members.reduce((sum, m) => sum + (num(m.weight) || 0), 0),
      // The settlement on chain, else the run's own copy (its draft, or what it submitted).
      settlement: onChain || (run && isObject(run.settlement) ? run.settlement : null),
    };
  }

  function shardSummary(v) {
    const {run, record, entry} = v;
    const items = [];
    if (run) {
      const certified = num(run.certified_round);
      const total = num(run.rounds_total);
      items.push(stat('Rounds certified', total
          ? `${fmtInt(certified)} of ${fmtInt(total)} ` +
            `(${Math.floor((100 * (certified || 0)) / total)} %)`
          : fmtInt(certified)));
      items.push(stat('Bytes exchanged', fmtBytes(run.bytes_exchanged)));
      items.push(stat('Wall time', fmtSeconds(run.wall_seconds)));
      items.push(stat('Inner steps time', fmtSeconds(run.inner_seconds)));
      items.push(stat('Planner', str(run.planner) ? h('code', null, shortAddress(run.planner))
                                                  : kDash));
      items.push(stat('Worker', str(run.worker_device) || kDash));
      items.push(stat('Parameters', fmtInt(run.parameters)));
      items.push(stat('Checkpoint', fmtBytes(run.checkpoint_bytes)));
      items.push(stat('Root', h('code', null, shortHex(base64ToHex(run.root), 16))));
      const restarts = [[run.worker_restarts, 'worker'], [run.shard_process_restarts, 'process']]
          .filter(([count]) => (num(count) || 0) > 0)
          .map(([count, what]) => `${fmtInt(count)} ${what}`);
      items.push(stat('Restarts', restarts.length ? restarts.join(', ') : 'none',
                      {warn: restarts.length > 0}));
    }
    items.push(stat('Hardware', str(record.hardware_profile) || kDash));
    items.push(stat('Total weight', fmtInt(v.totalWeight)));
    items.push(stat('This host', record.reserved ? `member, weight ${fmtInt(record.frozen_weight)}`
                               : record.reservation_sent ? 'reservation sent'
                               : 'not a member'));
    items.push(stat('Escrow', str(record.escrow) ? fmtNgonka(record.escrow) : kDash));
    if (num(entry.store_bytes) !== null) {
      items.push(stat('Artifacts stored here', fmtBytes(entry.store_bytes)));
    }
    items.push(stat('Deadline height', fmtInt(record.deadline_height)));

    const out = [stats(items)];
    if (run && str(run.error)) out.push(notice(`The run failed: ${str(run.error)}`));
    if (str(entry.run_error)) {
      out.push(notice(`The run's status could not be read: ${str(entry.run_error)}`));
    }
    if (str(record.skip_reason)) {
      out.push(notice(`Not reserved: ${str(record.skip_reason)}`, 'info'));
    }
    if (!run && !str(entry.run_error)) {
      out.push(notice('This host runs nothing for this shard: no rounds, losses or transitions ' +
                      'to show.', 'info'));
    }
    return out;
  }

  function shardMembers(v) {
    const {run, rounds, members, self} = v;
    const out = [h('h3', null, `Members (${members.length})`)];
    if (members.length === 0) {
      out.push(placeholder('No member has reserved yet.'));
      return out;
    }
    const signedBy = new Map();
    for (const r of rounds) {
      for (const m of list(r.members)) signedBy.set(str(m), (signedBy.get(str(m)) || 0) + 1);
    }
    const latest = new Set(rounds.length ? list(rounds[rounds.length - 1].members).map(str) : []);
    const cols = [{label: 'Host'}, {label: 'Weight', num: true}, {label: 'Share', num: true}];
    if (run) cols.push({label: 'Rounds signed', num: true}, {label: 'Latest round'});
    out.push(table(`shard-${v.sid}-members`, `Members of shard ${v.id} and their frozen weight`,
                   cols, members.map((m) => {
                     const who = str(m.host);
                     const cells = [address(who, self), fmtInt(m.weight),
                                    fmtPercent(m.weight, v.totalWeight)];
                     if (run) {
                       cells.push(String(signedBy.get(who) || 0),
                                  rounds.length === 0 ? kDash : latest.has(who) ? 'in' : 'out');
                     }
                     return {key: who, class: who === self ? 'self' : null, cells};
                   }), {name: 'members'}));
    return out;
  }

  // Axis labels with as many decimals as the step between ticks needs.
  function stepDecimals(v, step) {
    return v.toFixed(Math.max(0, Math.min(4, -Math.floor(Math.log10(step)))));
  }

  function shardCharts(v) {
    const {run, rounds, sid} = v;
    const train = rounds.filter((r) => (num(r.train_loss) || 0) > 0)
        .map((r) => ({x: r.round, y: num(r.train_loss)}));
    const evals = [];
    const initial = lossOfMicro(run.initial_eval_loss_micro);
    if (initial !== null) evals.push({x: 0, y: initial});
    for (const r of rounds) {
      const loss = lossOfMicro(r.eval_loss_micro);
      if (loss !== null) evals.push({x: r.round, y: loss});
    }
    // Bytes in one unit, chosen from the largest round's, so the axis reads in round numbers.
    const unit = byteUnit(Math.max(0, ...rounds.map((r) => num(r.bytes_exchanged) || 0)));
    const bytes = rounds.map((r) => ({x: r.round, y: (num(r.bytes_exchanged) || 0) / unit.size}));
    const ids = {train: `shard-${sid}-train-loss`, eval: `shard-${sid}-eval-loss`,
                 bytes: `shard-${sid}-bytes`};
    return [
      h('h3', null, 'Loss and traffic'),
      h('div', {class: 'charts'},
        lineChart({id: ids.train, name: 'train-loss', series: 'train', title: 'Train loss',
                   valueLabel: 'Train loss', points: train, format: fmtLoss,
                   axisFormat: stepDecimals, width: chartWidth(ids.train)}),
        lineChart({id: ids.eval, name: 'eval-loss', series: 'eval', title: 'Eval loss (held-out)',
                   valueLabel: 'Eval loss', points: evals, format: fmtLoss,
                   axisFormat: stepDecimals, width: chartWidth(ids.eval)}),
        lineChart({id: ids.bytes, name: 'bytes', series: 'bytes',
                   title: 'Bytes exchanged by this host', valueLabel: `Bytes (${unit.name})`,
                   points: bytes, format: (y) => `${y.toFixed(2)} ${unit.name}`,
                   axisFormat: (y, step) => `${stepDecimals(y, step)} ${unit.name}`, zero: true,
                   width: chartWidth(ids.bytes)})),
    ];
  }

  function shardRounds(v) {
    const {rounds, totalWeight} = v;
    const out = [h('h3', null, `Rounds (${rounds.length})`)];
    if (rounds.length === 0) {
      out.push(placeholder('No round certified yet.'));
      return out;
    }
    out.push(table(`shard-${v.sid}-rounds`,
                   `Certified rounds of shard ${v.id}, newest first (${rounds.length})`, [
      {label: 'Round', num: true}, {label: 'Attempt', num: true}, {label: 'Members', num: true},
      {label: 'Signed weight', num: true}, {label: 'Root'}, {label: 'Train loss', num: true},
      {label: 'Eval loss', num: true}, {label: 'Bytes', num: true}, {label: 'Inner', num: true},
      {label: 'Exchange', num: true}, {label: 'Certify', num: true},
      {label: 'Publish', num: true}, {label: 'Round time', num: true},
    ], rounds.slice().reverse().map((r) => ({
      key: String(r.round),
      cells: [
        String(r.round), fmtInt(r.attempt), String(list(r.members).length),
        h('span', null, fmtInt(r.signed_weight), totalWeight
            ? h('span', {class: 'muted'},
                ` (${Math.round((100 * (num(r.signed_weight) || 0)) / totalWeight)} %)`)
            : null),
        h('code', null, shortHex(base64ToHex(r.new_root), 8)),
        fmtLoss(num(r.train_loss) || null), fmtLoss(lossOfMicro(r.eval_loss_micro)),
        fmtBytes(r.bytes_exchanged), fmtSeconds(r.inner_seconds),
        fmtSeconds(r.exchange_seconds), fmtSeconds(r.certify_seconds),
        fmtSeconds(r.publish_seconds), fmtSeconds(r.round_seconds),
      ],
    })), {name: 'rounds'}));
    return out;
  }

  function shardMembership(v) {
    const events = membershipEvents(v.rounds);
    const count = (kind) => events.filter((e) => e.kind === kind).length;
    const out = [
      h('h3', null, 'Joins, leaves and rejoins'),
      h('p', {class: 'summary-line'},
        `${plural(count('joined'), 'join', 'joins')}, ${plural(count('left'), 'leave', 'leaves')}, ` +
        `${plural(count('rejoined'), 'rejoin', 'rejoins')} across the rounds above.`),
    ];
    if (events.length > 0) {
      out.push(h('ul', {class: 'events'}, events.slice().reverse().map((e, i) => h(
          'li', {'data-key': `${e.round}-${e.kind}-${e.host || i}`, class: `event event-${e.kind}`},
          h('span', {class: 'event-round'}, `Round ${e.round}`),
          e.kind === 'gap'
              ? ` this host took no part in rounds ${e.from}–${e.to}`
              : [' ', h('code', null, shortAddress(e.host)), ` ${e.kind}`]))));
    }

    const transitions = list(v.run.transitions).map(str);
    const listId = `shard-${v.sid}-transitions`;
    out.push(h('h3', {id: `${listId}-title`}, 'Transitions'));
    if (transitions.length === 0) {
      out.push(placeholder('No transition yet.'));
    } else {
      out.push(h('div', {class: 'scroll-box', role: 'region', tabindex: '0',
                         'aria-labelledby': `${listId}-title`},
                 h('ol', {class: 'transitions', reversed: true, id: listId},
                   keyByOccurrence(transitions).reverse().map(({key, text}) => h(
                       'li', {class: transitionClass(text), 'data-key': key}, text)))));
    }
    return out;
  }

  function shardVerification(v) {
    const {run} = v;
    const replays = num(run.replays) || 0;
    const passed = num(run.replays_passed) || 0;
    return [
      h('h3', null, 'Verification'),
      stats([
        stat('Replays run', fmtInt(replays)),
        stat('Reproduced', replays ? `${fmtInt(passed)} (${fmtPercent(passed, replays)})`
                                   : fmtInt(passed)),
        stat('Failed', fmtInt(replays - passed), {warn: replays - passed > 0}),
        stat('Marks on this host', fmtInt(run.marks), {warn: (num(run.marks) || 0) > 0}),
        stat('Replay time', fmtSeconds(run.replay_seconds)),
      ]),
    ];
  }

  // Verified work and pay per host (HostPayout): the settlement's stats and amounts.
  function shardPay(v) {
    const out = [h('h3', null, 'Verified work and pay')];
    const payouts = v.settlement ? list(v.settlement.payouts).filter(isObject) : [];
    if (payouts.length === 0) {
      out.push(placeholder('Pay is known once the shard settles.'));
      return out;
    }
    let paid = 0n;
    for (const p of payouts) paid += big(p.amount) || 0n;
    out.push(table(`shard-${v.sid}-payouts`, 'Verified work and pay per host' +
                   (v.onChain ? '' : ' (this host\'s draft, not yet on chain)'), [
      {label: 'Host'}, {label: 'Pay (ngonka)', num: true}, {label: 'Share', num: true},
      {label: 'Tokens', num: true}, {label: 'Rounds signed', num: true},
      {label: 'Verified', num: true}, {label: 'Rejected', num: true}, {label: 'Marks', num: true},
      {label: 'Score (nats)', num: true}, {label: 'Unhelpful', num: true},
    ], payouts.map((p) => {
      const amount = big(p.amount);
      const share = paid > 0n && amount !== null
          ? `${(Number((amount * 10000n) / paid) / 100).toFixed(1)} %` : kDash;
      return {key: str(p.host), class: str(p.host) === v.self ? 'self' : null, cells: [
        address(p.host, v.self), fmtInt(p.amount), share, fmtInt(p.tokens),
        fmtInt(p.rounds_contributed), fmtInt(p.verified), fmtInt(p.rejected), fmtInt(p.marks),
        num(p.score) === null ? kDash : (num(p.score) / 1e6).toFixed(3), fmtInt(p.unhelpful),
      ]};
    }), {name: 'payouts'}));
    return out;
  }

  function settlementState(v) {
    if (v.onChain) return `settled on chain at height ${fmtInt(v.settlementRecord.height)}`;
    if (v.run && str(v.run.settlement_txhash)) return 'submitted, waiting for the chain';
    if (v.record.settlement_signed) return 'signed by this host, not yet on chain';
    if (v.chain && enumName(v.chain.status, 'SHARD_STATUS_') === 'SETTLED') {
      return 'settled on chain';
    }
    return 'not settled';
  }

  function shardSettlement(v) {
    const {run, settlement, settlementRecord, totalWeight} = v;
    const items = [stat('Status', settlementState(v), {wide: true})];
    if (run && str(run.settlement_txhash)) {
      items.push(stat('Transaction', h('code', {class: 'break'}, str(run.settlement_txhash)),
                      {wide: true}));
    }
    const root = base64ToHex(settlement ? settlement.final_checkpoint_root
                                        : v.record.settlement_root);
    if (root) items.push(stat('Final root', h('code', {class: 'break'}, root), {wide: true}));
    if (settlement) {
      items.push(stat('Rounds settled', `${fmtInt(settlement.rounds_completed)} of ` +
                                        `${fmtInt(settlement.rounds_planned)}`));
      const evaluation = obj(settlement.evaluation);
      const loss = lossOfMicro(evaluation.value_micro);
      const metric = str(evaluation.metric).replace(/_/g, ' ');
      items.push(stat(metric ? metric.charAt(0).toUpperCase() + metric.slice(1) : 'Evaluation',
                      loss === null ? kDash
                      : `${fmtLoss(loss)} (${plural(num(evaluation.evaluators) || 0,
                                                    'evaluator', 'evaluators')})`));
      items.push(stat('Refund', fmtNgonka(settlement.refund)));
    }
    if (settlementRecord) {
      const signed = settlementRecord.signed_weight;
      items.push(stat('Signed weight', totalWeight
          ? `${fmtInt(signed)} (${fmtPercent(signed, totalWeight)})` : fmtInt(signed)));
      items.push(stat('Signatures', fmtInt(list(settlementRecord.signatures).length)));
      items.push(stat('Submitter', str(settlementRecord.submitter)
          ? h('code', null, shortAddress(settlementRecord.submitter)) : kDash));
    }
    return [h('h3', null, 'Settlement'), stats(items)];
  }

  function renderShard(entry, self, chainShards) {
    const v = shardView(entry, self, chainShards);
    const titleId = `shard-${v.sid}-title`;
    const parts = [
      h('div', {class: 'shard-head'},
        h('h2', {id: titleId}, `Shard ${v.id}`),
        statusBadge(v.record.status),
        v.run ? runBadge(v.run.state) : null),
      shardSummary(v),
      shardMembers(v),
    ];
    if (v.run) {
      parts.push(shardCharts(v), shardRounds(v), shardMembership(v), shardVerification(v));
    }
    // A shard this host runs nothing for has pay and a settlement to show only once settled.
    if (v.run || v.settlement) parts.push(shardPay(v), shardSettlement(v));
    return h('section', {class: 'panel shard', id: `shard-${v.sid}`, 'data-key': `shard-${v.id}`,
                         'data-shard-id': v.id, 'aria-labelledby': titleId}, parts);
  }

  // ------------------------------------------------------------------------------------------
  // The page

  function shardIdOf(entry) {
    return obj(entry.record).shard_id || obj(entry.run).shard_id;
  }

  let lastOverview = null;
  let redrawing = false;

  // Whether a chart was drawn for another width than its box has (the first update draws
  // before any box exists; a resize changes them).
  function chartsNeedWidth() {
    for (const chart of document.querySelectorAll('svg.chart')) {
      const drawnFor = Number((chart.getAttribute('viewBox') || '').split(' ')[2]);
      const has = chart.getBoundingClientRect().width;
      if (has > 0 && Math.abs(Math.max(240, Math.round(has)) - drawnFor) > 2) return true;
    }
    return false;
  }

  function render(o) {
    const host = obj(o.host);
    const self = str(host.address);
    // An entry names its shard by its record, or by its run where the record is missing.
    const entries = list(o.shards).map(obj).filter((e) => str(shardIdOf(e))).sort((a, b) => {
      const runs = (isObject(b.run) ? 1 : 0) - (isObject(a.run) ? 1 : 0);
      return runs || (num(shardIdOf(b)) || 0) - (num(shardIdOf(a)) || 0);
    });
    const chainShards = new Map();
    if (isObject(o.network)) {
      for (const s of list(o.network.shards).map(obj)) chainShards.set(str(s.id), s);
    }
    const shardIds = new Set(entries.map((e) => str(shardIdOf(e))));
    morphInto(document.getElementById('host-body'), h('div', null, renderHost(o)));
    morphInto(document.getElementById('network-body'),
              h('div', null, renderNetwork(o, self, shardIds)));
    const shardsError = str(o.shards_error)
        ? notice(`This host's shards could not be read: ${str(o.shards_error)}`) : null;
    morphInto(document.getElementById('shards'), h('div', null, shardsError, entries.length === 0
        ? h('section', {class: 'panel', 'aria-labelledby': 'no-shards-title'},
            h('h2', {id: 'no-shards-title'}, 'Shards'),
            placeholder('This host knows no shard yet.'))
        : entries.map((e) => renderShard(e, self, chainShards))));
    morphInto(document.getElementById('nav'), h('ul', null,
        h('li', null, h('a', {href: '#host'}, 'Host')),
        h('li', null, h('a', {href: '#network'}, 'Network')),
        entries.map((e) => {
          const id = str(shardIdOf(e));
          return h('li', {'data-key': id}, h('a', {href: `#shard-${cssId(id)}`}, `Shard ${id}`));
        })));
    if (!redrawing && chartsNeedWidth()) {
      redrawing = true;
      try {
        render(o);
      } finally {
        redrawing = false;
      }
    }
    const generated = num(o.generated_unix_ms);
    document.getElementById('main').setAttribute('data-generated', String(generated || 0));
    if (self) document.title = `trainshard host ${shortAddress(self)}`;
  }

  // Connection state ---------------------------------------------------------------------------

  let failures = 0;
  let failingSince = 0;

  function setConnection(state, text, detail) {
    const box = document.getElementById('connection');
    const live = document.getElementById('connection-text');
    if (box.getAttribute('data-state') !== state) box.setAttribute('data-state', state);
    // Only a change of state or error reaches the live region, so a screen reader hears each
    // once, not every 2 s.
    if (live.textContent !== text) live.textContent = text;
    const d = document.getElementById('connection-detail');
    if (d.textContent !== detail) d.textContent = detail;
    document.getElementById('main').classList.toggle('stale', state === 'reconnecting');
  }

  function onSuccess(o) {
    failures = 0;
    failingSince = 0;
    lastOverview = o;
    try {
      render(o);
    } catch (e) {
      // A bug of this page: keep polling, say so, and log it for whoever debugs the page.
      setConnection('error', 'Live, but the page could not show this update', String(e));
      console.error('stats page: rendering the overview failed:', e);
      return;
    }
    const at = fmtTime(o.generated_unix_ms) || fmtTime(Date.now());
    setConnection('live', 'Live', `updated ${at}`);
  }

  function onFailure(why) {
    ++failures;
    if (!failingSince) failingSince = Date.now();
    setConnection('reconnecting', `Reconnecting: ${why}`,
                  `${plural(failures, 'failed attempt', 'failed attempts')} since ` +
                  `${fmtTime(failingSince)}${lastOverview ? '; showing the last update' : ''}`);
  }

  async function pollOnce() {
    const controller = typeof AbortController === 'function' ? new AbortController() : null;
    const timer = controller ? setTimeout(() => controller.abort(), kFetchTimeoutMs) : null;
    let response;
    try {
      response = await fetch(kApiPath, {cache: 'no-store', headers: {Accept: 'application/json'},
                                        signal: controller ? controller.signal : undefined});
    } catch (e) {
      onFailure(e && e.name === 'AbortError'
                    ? `no answer within ${kFetchTimeoutMs / 1000} s`
                    : 'the daemon cannot be reached');
      return;
    } finally {
      if (timer) clearTimeout(timer);
    }
    if (!response.ok) {
      let body = '';
      try {
        body = (await response.text()).trim().slice(0, 160);
      } catch (e) {
        body = '';
      }
      onFailure(`HTTP ${response.status}${response.statusText ? ` ${response.statusText}` : ''}` +
                `${body && !/^</.test(body) ? ` (${body})` : ''}`);
      return;
    }
    let overview;
    try {
      overview = await response.json();
    } catch (e) {
      onFailure('the answer is not JSON');
      return;
    }
    if (!isObject(overview)) {
      onFailure('the answer is not a JSON object');
      return;
    }
    onSuccess(overview);
  }

  async function loop() {
    try {
      await pollOnce();
    } catch (e) {
      console.error('stats page: polling failed:', e);
    }
    setTimeout(loop, kPollMs);
  }

  // Charts are sized to their boxes: draw them again when the page's width changes.
  let resizeTimer = null;
  let lastWidth = 0;
  function onResize() {
    const main = document.getElementById('main');
    if (!main || main.clientWidth === lastWidth) return;
    lastWidth = main.clientWidth;
    if (resizeTimer) clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      resizeTimer = null;
      if (!lastOverview) return;
      try {
        render(lastOverview);
      } catch (e) {
        console.error('stats page: rendering the overview failed:', e);
      }
    }, 120);
  }

  function start() {
    lastWidth = document.getElementById('main').clientWidth;
    window.addEventListener('resize', onResize);
    loop();
  }

  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', start);
  } else {
    start();
  }
})();
