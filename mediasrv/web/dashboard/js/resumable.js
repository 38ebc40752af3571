// Large files go up resumably over tus (POST /uploads, then PATCH chunks), with tus-js-client
// 4.3.1 (vendor/tus-js-client, loaded by index.html as window.tus): a well-kept client, not one
// written here. tus-js-client remembers each upload's URL in this origin's localStorage under
// the file's fingerprint (name, type, size, last modified), so after a dropped connection, a
// 429 wait or a page reload, the same file given again goes on from the offset the server
// acknowledged (HEAD) instead of from the start.
//
// sendResumable resolves the same shape as api.js's sendUpload, so the upload queue treats both
// alike: {status, body, retryAfterS, serverDate, sent, aborted, resumedFrom}; 201 with the stored
// file when done. A Cancel ends the upload on the server too (DELETE: its bytes and reserved
// quota go); logging out only stops it, to be resumed later.
import { api, currentToken, dropToken, retryAfterSeconds } from './api.js';

export const RESUMABLE_ABOVE = 8 * 1024 * 1024;
export const CHUNK_SIZE = 8 * 1024 * 1024;
const RETRY_DELAYS_MS = [0, 1000, 3000, 5000];

function parse(text) {
  try {
    return text ? JSON.parse(text) : null;
  } catch {
    return { error: text.slice(0, 200) };
  }
}

export function sendResumable(file, { isPublic, onProgress = () => {}, signal } = {}) {
  const tus = globalThis.tus;
  return new Promise((resolve) => {
    let token = null;
    let resumedFrom = null;
    let done = false;
    const finish = (result) => {
      if (done) return;
      done = true;
      if (signal) signal.removeEventListener('abort', onAbort);
      resolve({ body: null, retryAfterS: null, serverDate: null, sent: false, aborted: false, resumedFrom, ...result });
    };
    const upload = new tus.Upload(file, {
      endpoint: '/uploads',
      chunkSize: CHUNK_SIZE,
      retryDelays: RETRY_DELAYS_MS,
      storeFingerprintForResuming: true,
      removeFingerprintOnSuccess: true,
      metadata: { filename: file.name, filetype: file.type || '', is_public: isPublic ? 'true' : 'false' },
      async onBeforeRequest(req) {
        token = await currentToken();
        req.setHeader('Authorization', `Bearer ${token}`);
      },
      onShouldRetry(err, attempt) {
        const status = err.originalResponse ? err.originalResponse.getStatus() : 0;
        if (status === 401 && attempt < 1) { // the access token expired: refresh it, once
          dropToken(token);
          return true;
        }
        // A dropped connection or a server error: ask where the upload stands (HEAD), go on.
        // 409: another request of ours was writing it, or an answer was lost: the same.
        // 429 and 503 go to the upload queue, which waits for the whole account (Retry-After).
        return status === 0 || status === 409 || status === 423 || (status >= 500 && status !== 503);
      },
      onProgress(sent) {
        if (resumedFrom === null) resumedFrom = sent;
        onProgress(sent, file.size);
      },
      async onSuccess() {
        const id = upload.url.split('/').pop();
        try {
          finish({ status: 201, body: { file: await api('GET', `/files/${id}`) } });
        } catch (e) {
          finish({ status: e.status || 0, body: e.body || { error: e.message } });
        }
      },
      onError(err) {
        const response = err.originalResponse;
        if (!response) {
          finish({ status: 0, body: { error: err.message } });
          return;
        }
        finish({ status: response.getStatus(), body: parse(response.getBody()),
          retryAfterS: retryAfterSeconds(response.getHeader('Retry-After')),
          serverDate: response.getHeader('Date') });
      },
    });
    const onAbort = () => {
      upload.abort(signal.reason === 'cancel').catch(() => {});
      finish({ status: 0, aborted: true });
    };
    if (signal) signal.addEventListener('abort', onAbort, { once: true });
    upload.findPreviousUploads().then((previous) => {
      if (done) return;
      if (previous.length) upload.resumeFromPreviousUpload(previous[0]);
      upload.start();
    }, () => upload.start());
  });
}
