// What kind of file a content type is (the Files filter), and how the browser can show it
// (the file view's preview). The server filters by kind itself (GET /files?kind=, store/kinds.py);
// this copy of its rules only labels a file already listed.

export const KINDS = [['', 'All kinds'], ['image', 'Images'], ['document', 'Documents'], ['video', 'Video'],
  ['audio', 'Audio'], ['archive', 'Archives'], ['other', 'Other']];

/** Stored types /m/<id>?width= can resize (the server never enlarges, and answers a web format). */
export const RESIZABLE = new Set(['image/jpeg', 'image/png', 'image/gif', 'image/webp', 'image/avif', 'image/tiff',
  'image/heic', 'image/heif', 'image/bmp']);

const DOCUMENTS = new Set(['application/pdf', 'application/json', 'application/rtf', 'application/msword',
  'application/vnd.ms-excel', 'application/vnd.ms-powerpoint', 'application/epub+zip', 'application/xml',
  'application/xhtml+xml']);
const DOCUMENT_PREFIXES = ['text/', 'application/vnd.openxmlformats-officedocument.', 'application/vnd.oasis.opendocument.'];
const ARCHIVES = new Set(['application/zip', 'application/gzip', 'application/x-tar', 'application/x-7z-compressed',
  'application/vnd.rar', 'application/x-bzip2', 'application/x-xz', 'application/zstd']);
const TEXT_TYPES = new Set(['application/json', 'application/xml']);

function essence(type) {
  return (type || '').split(';', 1)[0].trim().toLowerCase();
}

/** 'image', 'document', 'video', 'audio', 'archive' or 'other': store/kinds.py's rules, for display. */
export function kindOf(contentType) {
  const type = essence(contentType);
  for (const kind of ['image', 'video', 'audio']) {
    if (type.startsWith(`${kind}/`)) return kind;
  }
  if (DOCUMENTS.has(type) || DOCUMENT_PREFIXES.some((p) => type.startsWith(p))) return 'document';
  if (ARCHIVES.has(type)) return 'archive';
  return 'other';
}

/**
 * How the file view previews a type in this browser: 'image', 'pdf', 'video', 'audio', 'text',
 * or null (a download link only).
 */
export function previewOf(contentType, doc = document, nav = navigator) {
  const type = essence(contentType);
  if (type.startsWith('image/')) return 'image';
  if (type === 'application/pdf') return nav.pdfViewerEnabled ? 'pdf' : null;
  if (type.startsWith('video/') || type.startsWith('audio/')) {
    const tag = type.startsWith('video/') ? 'video' : 'audio';
    return doc.createElement(tag).canPlayType(type) ? tag : null;
  }
  if (type.startsWith('text/') || TEXT_TYPES.has(type)) return 'text';
  return null;
}
