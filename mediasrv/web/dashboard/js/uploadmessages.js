// A failed upload's row says what happened in words for a person, from the server's error code
// ("this file's type is not accepted; allowed types are ..."), not the API's sentence.
import { formatBytes } from './dom.js';
import { kindOf } from './kinds.js';

let allowed = null; // the server's list, fetched once per page load
let asking = null;

/** The content types the server accepts (GET /reference/allowed-content-types), fetched once. */
export function allowedTypes() {
  if (!asking) {
    asking = fetch('/reference/allowed-content-types', { credentials: 'omit' })
      .then(async (r) => { allowed = r.ok ? (await r.json()).content_types : []; return allowed; })
      .catch(() => { asking = null; return []; });
  }
  return asking;
}

/** The list if it has arrived (a row is redrawn when it does), else null. */
export function knownAllowedTypes() {
  return allowed;
}

const KIND_NAMES = { image: 'images', video: 'video', audio: 'audio', document: 'documents', archive: 'archives',
  other: 'other files' };
const SHORT = { 'vnd.openxmlformats-officedocument.wordprocessingml.document': 'DOCX',
  'vnd.openxmlformats-officedocument.spreadsheetml.sheet': 'XLSX',
  'vnd.openxmlformats-officedocument.presentationml.presentation': 'PPTX', msword: 'DOC', 'vnd.ms-excel': 'XLS',
  'vnd.ms-powerpoint': 'PPT', 'vnd.oasis.opendocument.text': 'ODT', 'vnd.oasis.opendocument.spreadsheet': 'ODS',
  'vnd.oasis.opendocument.presentation': 'ODP', 'vnd.oasis.opendocument.graphics': 'ODG', 'epub+zip': 'EPUB',
  'svg+xml': 'SVG', 'x-icon': 'ICO', plain: 'TXT', markdown: 'MD', 'x-matroska': 'MKV', quicktime: 'MOV',
  'x-msvideo': 'AVI', mpeg: 'MP3', 'x-7z-compressed': '7Z', 'vnd.rar': 'RAR', 'x-bzip2': 'BZ2', 'x-tar': 'TAR',
  'x-xz': 'XZ', gzip: 'GZ', zstd: 'ZST' };

const PER_KIND = 5;
// The names people know first, shown before the rest of their kind.
const FAMILIAR = ['JPEG', 'PNG', 'GIF', 'WEBP', 'HEIC', 'MP4', 'MOV', 'WEBM', 'MP3', 'WAV', 'FLAC', 'PDF', 'DOCX',
  'XLSX', 'PPTX', 'ODT', 'TXT', 'ZIP', '7Z', 'RAR', 'TAR', 'GZ'];
const rank = (name) => (FAMILIAR.includes(name) ? FAMILIAR.indexOf(name) : FAMILIAR.length);

/** "images (JPEG, PNG, ...), documents (PDF, DOCX, ...)": the allowed list, for a person. */
export function describeTypes(types) {
  const byKind = new Map();
  for (const type of types) {
    const kind = kindOf(type);
    const sub = type.split('/')[1] || type;
    const name = SHORT[sub] || sub.replace(/^x-/, '').toUpperCase();
    if (!byKind.has(kind)) byKind.set(kind, []);
    if (!byKind.get(kind).includes(name)) byKind.get(kind).push(name);
  }
  // A few names per kind: a sentence a person reads, not the whole list (GET /reference/...).
  return [...byKind].map(([kind, all]) => [kind, [...all].sort((a, b) => rank(a) - rank(b))])
    .map(([kind, names]) => `${KIND_NAMES[kind]} (${names.slice(0, PER_KIND).join(', ')}`
    + `${names.length > PER_KIND ? ', …' : ''})`).join(', ');
}

/** The sentence a failed row shows. `allowed` is the server's list of types, or null. */
export function failureText(row, allowed = knownAllowedTypes()) {
  const type = row.file.type || 'unknown';
  switch (row.code) {
    case 'CONTENT_TYPE_NOT_ALLOWED':
    case 'UNRECOGNIZED_CONTENT':
      return `This file's type (${type}) is not accepted`
        + (allowed && allowed.length ? `; allowed types are ${describeTypes(allowed)}.` : '.');
    case 'CONTENT_MISMATCH':
      return `This file's contents are not what its name says (${type}); it may be damaged or renamed.`;
    case 'FILE_TOO_LARGE':
      return `This file (${formatBytes(row.file.size)}) is larger than your upload limit (see Settings).`;
    case 'QUOTA_EXCEEDED':
      return 'Your storage is full: delete some files, or ask the operator for more room.';
    case 'IMAGE_TOO_LARGE':
      return 'This image has too many pixels for the server to process.';
    case 'EMPTY_BODY':
      return 'This file is empty.';
    case 'NO_SESSION':
    case 'SESSION_ENDED':
      return 'You were logged out before it was sent: log in again and retry.';
    default:
      return row.message ? `${row.message.replace(/\.$/, '')}.` : 'The upload failed.';
  }
}
