// The API client and the session.
//
// Where the tokens live:
// - the access token (short-lived JWT) only in this module's memory: no storage, no cookie;
// - the refresh token in sessionStorage of the dashboard's origin, so a reload keeps the tab
//   logged in and closing the tab forgets it. Uploaded files are served with
//   "Content-Security-Policy: sandbox", which gives them an opaque origin: a script in an
//   uploaded file cannot read this origin's storage. The dashboard's own CSP allows only its
//   own scripts, and views write untrusted text with textContent, never innerHTML.
// A 401 triggers one silent POST /auth/refresh and one retry; if that fails the session ends.
// Tabs share the session (tabsession.js): one tab refreshes, every tab logs out together.
import {
  askLeaderToRefresh, connectTabs, endEverywhere, isLeader, leave, resumeSession, shareSession,
} from './tabsession.js';

const REFRESH_KEY = 'mediasrv.refresh_token';

let access = null; // the access token string, in memory only
let refreshing = null; // the refresh in flight, shared by every caller
const sessionListeners = new Set();

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error) || (status ? `Request failed (HTTP ${status})` : 'Network error'));
    this.status = status;
    this.code = body && body.code;
    this.body = body;
  }
}

export function onSessionEnd(listener) {
  sessionListeners.add(listener);
}

function startSession(session, { shared = true } = {}) {
  access = session.access_token;
  sessionStorage.setItem(REFRESH_KEY, session.refresh_token);
  if (shared) shareSession({ access_token: session.access_token, refresh_token: session.refresh_token });
}

/** The session ended: here only (another tab said so), or in every tab (`everywhere`). */
function endSession({ everywhere = true, reason = 'ended' } = {}) {
  const had = access !== null || sessionStorage.getItem(REFRESH_KEY) !== null;
  access = null;
  sessionStorage.removeItem(REFRESH_KEY);
  if (everywhere) endEverywhere(reason); else leave();
  if (had) sessionListeners.forEach((listener) => listener(reason));
}

export function hasSession() {
  return access !== null || sessionStorage.getItem(REFRESH_KEY) !== null;
}

function parseBody(text) {
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    return { error: text.slice(0, 200) };
  }
}

function withQuery(path, query) {
  if (!query) return path;
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) {
    if (value !== undefined && value !== null && value !== '') params.set(name, String(value));
  }
  const text = params.toString();
  return text ? `${path}?${text}` : path;
}

async function send(method, path, { json, token, query } = {}) {
  const headers = {};
  if (json !== undefined) headers['Content-Type'] = 'application/json';
  if (token) headers.Authorization = `Bearer ${token}`;
  let response;
  try {
    response = await fetch(withQuery(path, query), {
      method, headers, body: json === undefined ? undefined : JSON.stringify(json),
      credentials: 'omit', cache: 'no-store',
    });
  } catch {
    throw new ApiError(0, null);
  }
  const body = response.status === 204 ? null : parseBody(await response.text());
  return { status: response.status, ok: response.ok, body, headers: response.headers };
}

/** A call that needs no credential (register, login, forgot and reset password). */
export async function anonymous(method, path, json) {
  const r = await send(method, path, { json });
  if (!r.ok) throw new ApiError(r.status, r.body);
  return r.body;
}

export async function login(email, password) {
  const body = await anonymous('POST', '/auth/login', { email, password });
  startSession(body.session);
  return body.user;
}

export async function logout() {
  const token = sessionStorage.getItem(REFRESH_KEY);
  access = null;
  endEverywhere('logout');
  sessionStorage.clear(); // everything this tab kept for the dashboard
  if (token) {
    try {
      await send('POST', '/auth/logout', { json: { refresh_token: token } });
    } catch {
      // Offline: the token is forgotten here and expires on the server.
    }
  }
}

connectTabs({
  adopt: (session) => startSession(session, { shared: false }),
  ended: (reason) => endSession({ everywhere: false, reason }),
  current: () => {
    const token = sessionStorage.getItem(REFRESH_KEY);
    return access && token ? { access_token: access, refresh_token: token } : null;
  },
  refreshHere: () => refresh(),
});

/** At page load: the session another tab has, else this tab's own (a reload refreshes it). */
export async function resume() {
  if (await resumeSession(sessionStorage.getItem(REFRESH_KEY) !== null) === 'lead') await refresh();
}

/** Trade the refresh token for a new session; concurrent callers share one request. */
export function refresh() {
  if (!refreshing) {
    refreshing = (async () => {
      if (!isLeader()) { // the leading tab refreshes, and every tab gets the new session
        const failed = access;
        const session = await askLeaderToRefresh(failed);
        if (session) return;
        if (!isLeader()) throw new ApiError(0, { error: 'Another dashboard tab did not answer; reload the page' });
      }
      const token = sessionStorage.getItem(REFRESH_KEY);
      if (!token) {
        endSession();
        throw new ApiError(401, { error: 'Your session has ended; log in again', code: 'NO_SESSION' });
      }
      const r = await send('POST', '/auth/refresh', { json: { refresh_token: token } });
      if (r.status === 401) {
        endSession();
        throw new ApiError(401, { error: 'Your session has ended; log in again', code: 'SESSION_ENDED' });
      }
      if (!r.ok) throw new ApiError(r.status, r.body);
      startSession(r.body.session);
    })().finally(() => {
      refreshing = null;
    });
  }
  return refreshing;
}

export async function currentToken() {
  if (access === null) await refresh();
  return access;
}

/** `token` was refused (401): the next `currentToken` refreshes, unless another call did already. */
export function dropToken(token) {
  if (access === token) access = null;
}

/** An authenticated JSON call: a 401 refreshes the session once, silently, and retries. */
export async function api(method, path, { json, query } = {}) {
  for (let attempt = 0; ; attempt += 1) {
    const token = await currentToken();
    const r = await send(method, path, { json, token, query });
    if (r.status === 401 && attempt === 0) {
      if (access === token) access = null; // expired or revoked: refresh, unless another call did
      continue;
    }
    if (r.status === 401) endSession();
    if (!r.ok) throw new ApiError(r.status, r.body);
    return r.body;
  }
}

/** An authenticated GET of bytes (a private thumbnail): a Blob. */
export async function fetchBlob(path) {
  for (let attempt = 0; ; attempt += 1) {
    const token = await currentToken();
    const response = await fetch(path, { headers: { Authorization: `Bearer ${token}` }, credentials: 'omit' });
    if (response.status === 401 && attempt === 0) {
      if (access === token) access = null;
      continue;
    }
    if (!response.ok) throw new ApiError(response.status, null);
    return response.blob();
  }
}

/** An authenticated GET of at most the first `maxBytes` of a file, as text (a preview). */
export async function fetchTextHead(path, maxBytes) {
  for (let attempt = 0; ; attempt += 1) {
    const token = await currentToken();
    let response;
    try {
      response = await fetch(path, { headers: { Authorization: `Bearer ${token}`, Range: `bytes=0-${maxBytes - 1}` },
        credentials: 'omit' });
    } catch {
      throw new ApiError(0, null);
    }
    if (response.status === 401 && attempt === 0) {
      if (access === token) access = null;
      continue;
    }
    if (!response.ok) throw new ApiError(response.status, null);
    const bytes = new Uint8Array(await response.arrayBuffer()).subarray(0, maxBytes);
    return new TextDecoder('utf-8').decode(bytes);
  }
}

/** Seconds a Retry-After header asks for (delta-seconds or an HTTP date); null when absent or unreadable. */
export function retryAfterSeconds(value, now = Date.now()) {
  if (!value) return null;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text);
  const at = Date.parse(text);
  return Number.isNaN(at) ? null : Math.max(0, Math.ceil((at - now) / 1000));
}

function xhrUpload(file, token, { isPublic, onProgress, signal }) {
  return new Promise((resolve) => {
    const xhr = new XMLHttpRequest();
    let sent = false; // every byte of the body left: the server may have stored it
    const abort = () => xhr.abort();
    const finish = (result) => {
      if (signal) signal.removeEventListener('abort', abort);
      resolve({ sent, body: null, retryAfterS: null, serverDate: null, aborted: false, ...result });
    };
    xhr.open('POST', withQuery('/files', { isPublic: isPublic ? 'true' : 'false' }));
    xhr.setRequestHeader('Authorization', `Bearer ${token}`);
    xhr.setRequestHeader('Content-Type', file.type || 'application/octet-stream');
    xhr.setRequestHeader('x-file-name', encodeURIComponent(file.name));
    xhr.upload.addEventListener('progress', (event) => {
      if (event.lengthComputable) onProgress(event.loaded, event.total);
    });
    xhr.upload.addEventListener('load', () => { sent = true; });
    xhr.addEventListener('load', () => finish({
      status: xhr.status, body: parseBody(xhr.responseText),
      retryAfterS: retryAfterSeconds(xhr.getResponseHeader('Retry-After')),
      serverDate: xhr.getResponseHeader('Date'),
    }));
    xhr.addEventListener('error', () => finish({ status: 0 }));
    xhr.addEventListener('abort', () => finish({ status: 0, aborted: true }));
    if (signal) signal.addEventListener('abort', abort, { once: true });
    xhr.send(file);
  });
}

/**
 * Send one File as the raw body of POST /files with XHR (fetch cannot report upload progress).
 * Never throws for an HTTP answer: the upload queue decides what a 429 or a dropped connection
 * means. Resolves {status, body, retryAfterS, serverDate, sent, aborted}; status 0 is a network
 * error (or an abort through `signal`). A 401 refreshes the session once and sends again.
 */
export async function sendUpload(file, { isPublic, onProgress = () => {}, signal } = {}) {
  for (let attempt = 0; ; attempt += 1) {
    const token = await currentToken();
    const r = await xhrUpload(file, token, { isPublic, onProgress, signal });
    if (r.status === 401 && attempt === 0) {
      if (access === token) access = null;
      continue;
    }
    if (r.status === 401) endSession();
    return r;
  }
}
