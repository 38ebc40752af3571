// The upload queue: every file given to the dashboard stays in it until it is stored, or it failed
// for a reason a person must see (and can retry), or that person removed it. No DOM here: the
// Files view draws the rows (views/uploadpanel.js) and listens for finished files.
//
// - 429 and 503 with Retry-After pause the whole queue (the limit is per account) for the time
//   the server asks, then it resumes by itself; the row that met the answer says
//   "waiting 41 s: rate limit" and counts down.
// - A network error (or a 500/502/503/504 without Retry-After) is retried with exponential
//   backoff, up to MAX_TRANSIENT_TRIES in a row; then the row fails and keeps a Retry button.
// - A network error after the whole body left is ambiguous (the server may have stored the
//   file and the answer was lost): before sending again, the queue looks for that file on the
//   server and adopts it, so a file does not arrive twice.
// - Any other answer (400, 403, 413, 415...) fails the row at once with the server's message.
// - Files larger than RESUMABLE_ABOVE go up resumably over tus (resumable.js, tus-js-client): a
//   retry, or the same file given again after a page reload, goes on from where the server is.
// Time is Date.now() and setTimeout only, so a test can drive it with a fake clock.
import { api, sendUpload } from './api.js';
import { RESUMABLE_ABOVE, sendResumable } from './resumable.js';

export const PARALLEL_UPLOADS = 3;
export const MAX_TRANSIENT_TRIES = 8;
const BACKOFF_CAP_S = 30;
const MAX_WAIT_S = 15 * 60; // a Retry-After beyond this is a misconfiguration: wait this long, then try
const DEFAULT_WAIT_S = 10; // a 429 without Retry-After
const SPEED_SAMPLE_MS = 250;
const TRANSIENT = new Set([0, 500, 502, 503, 504]);
const ACTIVE = new Set(['queued', 'uploading', 'waiting']);

/** Seconds before try number `n` (1-based) after a transient failure: 1, 2, 4 ... 30, with jitter. */
export function backoffSeconds(n, random = Math.random) {
  const base = Math.min(BACKOFF_CAP_S, 2 ** (n - 1));
  return base * (0.8 + 0.4 * random());
}

function failureMessage(r) {
  if (r.body && r.body.error) return r.body.error;
  return r.status ? `HTTP ${r.status}` : 'network error';
}

export class UploadQueue {
  constructor({ parallel = PARALLEL_UPLOADS, send = sendUpload, call = api, sendLarge = sendResumable,
    largeAbove = RESUMABLE_ABOVE } = {}) {
    this.parallel = parallel;
    this.send = send;
    this.sendLarge = sendLarge;
    this.largeAbove = largeAbove;
    this.call = call;
    this.rows = [];
    this.active = 0;
    this.pausedUntil = 0; // nothing starts before this time (ms): a 429 or 503 said so
    this.pauseReason = '';
    this.timer = null;
    this.listeners = new Set();
    this.claimed = new Set(); // file_ids this queue stored: never adopted twice
    this.skewMs = null; // server clock minus ours, from the last answer's Date header
    this.nextId = 1;
  }

  /** listener(event, row): 'added', 'removed', 'change' (any row or the pause), 'progress', 'done'. */
  subscribe(listener) {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  emit(event, row = null) {
    for (const listener of [...this.listeners]) listener(event, row);
  }

  /** Queue files (a FileList or an array of File). */
  add(files, { isPublic }) {
    for (const file of files) {
      const row = { id: this.nextId, file, isPublic, state: 'queued', loaded: 0, speed: null, startedAt: null,
        finishedAt: null, waitUntil: 0, reason: '', message: '', transient: 0, controller: null, result: null };
      this.nextId += 1;
      this.rows.push(row);
      this.emit('added', row);
    }
    this.pump();
  }

  counts() {
    const counts = { total: this.rows.length, queued: 0, uploading: 0, waiting: 0, done: 0, failed: 0, cancelled: 0 };
    for (const row of this.rows) counts[row.state] += 1;
    return counts;
  }

  /** Files still to go (queued, uploading or waiting). */
  pending() {
    return this.rows.filter((row) => ACTIVE.has(row.state)).length;
  }

  retry(row) {
    if (row.state !== 'failed' && row.state !== 'cancelled') return;
    Object.assign(row, { state: 'queued', message: '', transient: 0, loaded: 0, speed: null });
    this.pump();
  }

  retryFailed() {
    this.rows.filter((row) => row.state === 'failed').forEach((row) => this.retry(row));
  }

  /** Stop a row: a running upload is aborted; a queued or waiting one will not start. */
  cancel(row) {
    if (!ACTIVE.has(row.state)) return;
    if (row.controller) row.controller.abort('cancel'); // a resumable upload is ended on the server too
    Object.assign(row, { state: 'cancelled', message: '', speed: null });
    this.pump();
  }

  remove(row) {
    this.cancel(row);
    row.state = 'removed';
    this.rows = this.rows.filter((r) => r !== row);
    this.emit('removed', row);
    this.pump();
  }

  clearFinished() {
    this.rows.filter((row) => row.state === 'done').forEach((row) => this.remove(row));
  }

  /** Forget everything (log out): running uploads are aborted, nothing else starts. */
  clear() {
    const rows = this.rows;
    this.rows = [];
    for (const row of rows) {
      if (row.controller) row.controller.abort('logout'); // a resumable upload stays, to be resumed
      row.state = 'removed';
      this.emit('removed', row);
    }
    clearTimeout(this.timer);
    this.timer = null;
    this.pausedUntil = 0;
    this.emit('change');
  }

  /** Start what may start now, and wake up when the next wait ends. */
  pump() {
    const now = Date.now();
    if (now >= this.pausedUntil) {
      this.pauseReason = '';
      while (this.active < this.parallel) {
        const row = this.rows.find((r) => r.state === 'queued' || (r.state === 'waiting' && r.waitUntil <= now));
        if (!row) break;
        this.run(row);
      }
    }
    this.schedule(now);
    this.emit('change');
  }

  schedule(now) {
    clearTimeout(this.timer);
    this.timer = null;
    // Only waits still ahead: a row already due starts when a slot frees (run calls pump).
    const waits = this.rows.filter((r) => r.state === 'waiting').map((r) => r.waitUntil);
    waits.push(this.pausedUntil);
    const ahead = waits.filter((t) => t > now);
    if (!ahead.length) return;
    // Every second at most: the countdowns on screen tick with it.
    const delay = Math.min(1000, Math.min(...ahead) - now);
    this.timer = setTimeout(() => this.pump(), delay);
  }

  async run(row) {
    const controller = new AbortController();
    Object.assign(row, { state: 'uploading', loaded: 0, speed: null, startedAt: Date.now(), controller });
    this.active += 1;
    let sample = { at: row.startedAt, loaded: 0 };
    const onProgress = (loaded) => {
      const now = Date.now();
      row.loaded = loaded;
      if (now - sample.at >= SPEED_SAMPLE_MS) {
        const instant = ((loaded - sample.loaded) * 1000) / (now - sample.at);
        row.speed = row.speed === null ? instant : 0.7 * row.speed + 0.3 * instant;
        sample = { at: now, loaded };
      }
      this.emit('progress', row);
    };
    let r;
    try {
      const send = row.file.size > this.largeAbove ? this.sendLarge : this.send;
      r = await send(row.file, { isPublic: row.isPublic, onProgress, signal: controller.signal });
    } catch (e) { // no session (401 after a refresh), or the refresh itself met a network error
      r = { status: e.status || 0, body: e.body || { error: e.message }, sent: false, retryAfterS: null };
    } finally {
      this.active -= 1;
      row.controller = null;
    }
    if (r.serverDate) {
      const at = Date.parse(r.serverDate);
      if (!Number.isNaN(at)) this.skewMs = at - Date.now();
    }
    if (row.state === 'uploading') await this.settle(row, r); // else cancelled or removed meanwhile
    this.pump();
  }

  async settle(row, r) {
    if (r.status === 201) {
      this.finish(row, r.body.file);
    } else if (r.status === 429 || (r.status === 503 && r.retryAfterS !== null)) {
      const seconds = Math.min(MAX_WAIT_S, Math.max(1, r.retryAfterS ?? DEFAULT_WAIT_S));
      this.pause(seconds, r.status === 429 ? 'rate limit' : 'server busy');
      this.wait(row, this.pausedUntil, this.pauseReason);
    } else if (TRANSIENT.has(r.status)) {
      await this.transientFailure(row, r);
    } else {
      Object.assign(row, { state: 'failed', message: failureMessage(r), code: (r.body && r.body.code) || null });
    }
  }

  async transientFailure(row, r) {
    if (r.status === 0 && r.sent) {
      const landed = await this.findLanded(row);
      if (row.state !== 'uploading') return;
      if (landed) {
        this.finish(row, landed);
        return;
      }
    }
    if (this.pausedUntil > Date.now()) {
      // While the queue is paused by the server, a dropped connection is most likely the same
      // refusal (a large body is not read before a 429): wait with the others, costs no try.
      this.wait(row, this.pausedUntil, this.pauseReason);
      return;
    }
    row.transient += 1;
    const reason = r.status ? `server error ${r.status}` : 'network error';
    if (row.transient >= MAX_TRANSIENT_TRIES) {
      Object.assign(row, { state: 'failed', message: `${reason} (${row.transient} tries)` });
      return;
    }
    this.wait(row, Date.now() + backoffSeconds(row.transient) * 1000, reason);
  }

  /** How long a waiting row still waits and why (a pause of the queue may outlast its own wait). */
  waitOf(row, now = Date.now()) {
    const paused = this.pausedUntil > now && this.pausedUntil > row.waitUntil;
    const until = paused ? this.pausedUntil : row.waitUntil;
    return { seconds: Math.max(0, Math.ceil((until - now) / 1000)), reason: paused ? this.pauseReason : row.reason };
  }

  pause(seconds, reason) {
    const until = Date.now() + seconds * 1000;
    if (until > this.pausedUntil) {
      this.pausedUntil = until;
      this.pauseReason = reason;
    }
  }

  wait(row, until, reason) {
    // The bytes sent are not kept by the server: the bar starts again from 0 on the next try.
    Object.assign(row, { state: 'waiting', waitUntil: until, reason, speed: null, loaded: 0 });
  }

  finish(row, file) {
    Object.assign(row, { state: 'done', result: file, loaded: row.file.size, finishedAt: Date.now(), speed: null });
    this.claimed.add(file.file_id);
    this.emit('done', row);
  }

  /**
   * The file this row sent, if the server stored it although the answer was lost: same name,
   * size and visibility, created since the row started (by the server's clock), not already
   * one of this queue's files. null when none (or the lookup itself fails: then send again).
   */
  async findLanded(row) {
    const startedServer = row.startedAt + (this.skewMs ?? 0) - (this.skewMs === null ? 300_000 : 5_000);
    try {
      const body = await this.call('GET', '/files', { query: { q: row.file.name, sizeMin: row.file.size,
        sizeMax: row.file.size, isPublic: String(row.isPublic), limit: 20 } });
      return body.files.find((f) => f.name === row.file.name && !this.claimed.has(f.file_id)
        && Date.parse(f.created_at) >= startedServer) || null;
    } catch {
      return null;
    }
  }
}
