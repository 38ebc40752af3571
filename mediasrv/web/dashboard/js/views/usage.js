// Usage (counters and an inline-SVG bar chart of the server's daily counts) and the activity log.
import { api } from '../api.js';
import { errorBox, formatBytes, formatDate, h, pager } from '../dom.js';

const SVG = 'http://www.w3.org/2000/svg';
const DAYS = 14;

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  children.forEach((c) => el.append(c instanceof Node ? c : document.createTextNode(String(c))));
  return el;
}

/** Bars of [label, value] pairs, drawn as inline SVG (no library, nothing from a CDN). */
export function barChart(points, title) {
  const width = 560;
  const height = 180;
  const pad = { top: 16, bottom: 28, left: 8, right: 8 };
  const max = Math.max(1, ...points.map(([, v]) => v));
  const slot = (width - pad.left - pad.right) / points.length;
  const bars = points.flatMap(([label, value], i) => {
    const barHeight = ((height - pad.top - pad.bottom) * value) / max;
    const x = pad.left + i * slot + slot * 0.15;
    const y = height - pad.bottom - barHeight;
    return [
      svg('rect', { x, y, width: slot * 0.7, height: Math.max(barHeight, value ? 1 : 0), rx: 2,
        class: i === points.length - 1 ? 'bar today' : 'bar' },
        svg('title', {}, `${label}: ${value}`)),
      value ? svg('text', { x: x + slot * 0.35, y: y - 4, 'text-anchor': 'middle', class: 'bar-value' }, value) : null,
      svg('text', { x: x + slot * 0.35, y: height - 10, 'text-anchor': 'middle', class: 'bar-label' }, label),
    ].filter(Boolean);
  });
  const summary = points.map(([l, v]) => `${l}: ${v}`).join(', ');
  return svg('svg', { viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': `${title}. ${summary}`,
    class: 'chart' }, svg('title', {}, title),
  svg('line', { x1: pad.left, x2: width - pad.right, y1: height - pad.bottom, y2: height - pad.bottom, class: 'axis' }),
  ...bars);
}

/** "28/11" for the server's UTC day "2026-11-28". */
function dayLabel(date) {
  const [, month, day] = date.split('-');
  return `${Number(day)}/${Number(month)}`;
}

export function usageView() {
  const error = errorBox();
  const stats = h('dl', { class: 'stats' });
  const chart = h('figure', { class: 'card' }, h('p', { class: 'muted' }, 'Loading…'));
  // The counts per day are the server's (GET /usage/daily): every request of the day, however
  // many, not the latest page of the activity log.
  Promise.all([api('GET', '/usage'), api('GET', '/usage/daily', { query: { days: DAYS } })])
    .then(([usage, daily]) => {
      const items = [
        ['Storage', formatBytes(usage.storage_bytes)], ['Files', usage.files_count],
        ['Origin reads', usage.origin_reads], ['Image operations', usage.image_ops],
      ];
      stats.replaceChildren(...items.map(([k, v]) => h('div', { class: 'stat' }, h('dt', {}, k), h('dd', {}, v))));
      const points = daily.days.map((day) => [dayLabel(day.date), day.api_requests]);
      const total = daily.days.reduce((sum, day) => sum + day.api_requests, 0);
      chart.replaceChildren(
        barChart(points, `API requests per day, last ${DAYS} days`),
        h('figcaption', {}, `API requests per day over the last ${DAYS} days (UTC days), ${total.toLocaleString()} `
          + `in all, counted by the server. This month: ${formatDate(usage.period_start)} to `
          + `${formatDate(usage.period_end)}.`));
    })
    .catch((e) => error.show(e.message));
  return [h('h1', {}, 'Usage'), error.el, stats, chart];
}

export function activityView() {
  const state = { page: 1 };
  const error = errorBox();
  const tbody = h('tbody');
  const pagerSlot = h('div');
  async function load() {
    try {
      const body = await api('GET', '/logs', { query: { page: state.page, limit: 50 } });
      // data-label: on a narrow screen each row becomes a small card of "label value" lines.
      const cell = (label, content, attrs = {}) => h('td', { ...attrs, dataset: { label } }, content);
      tbody.replaceChildren(...(body.logs.length ? body.logs.map((e) => h('tr', {},
        cell('Time', formatDate(e.created_at)), cell('Method', h('code', {}, e.method)),
        cell('Path', h('code', {}, e.path)),
        cell('Status', e.status_code, { class: e.status_code >= 400 ? 'bad' : '' }),
        cell('Size', e.request_size_bytes === null ? '—' : formatBytes(e.request_size_bytes)),
        cell('Credential', (e.metadata && e.metadata.credential) === 'api_key' ? 'API key' : 'Session')))
        : [h('tr', {}, h('td', { colspan: '6', class: 'empty' }, 'No activity yet.'))]));
      pagerSlot.replaceChildren(pager(body, (p) => { state.page = p; load(); }, 'Activity pages'));
    } catch (e) {
      error.show(e.message);
    }
  }
  load();
  return [
    h('h1', {}, 'Activity'), error.el,
    h('table', { class: 'table responsive' }, h('caption', { class: 'visually-hidden' }, 'Your recent API requests'),
      h('thead', {}, h('tr', {}, ...['Time', 'Method', 'Path', 'Status', 'Size', 'Credential']
        .map((t) => h('th', { scope: 'col' }, t)))), tbody),
    pagerSlot,
  ];
}
