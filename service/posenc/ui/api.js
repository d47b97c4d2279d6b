// The /v1 API of this server (same origin; the API key typed into the page is sent as a bearer
// token), the keys and URLs of the tables seen so far, and the facts the server publishes
// (GET /v1/kinds: consumer profiles, tolerances per dtype, size limits).

export const PREVIEW_POINTS = 65536;

// What the page shows now: the model (its table entries) and the table plotted.
export const session = {
  apiKey: sessionStorage.getItem("posenc-api-key") || "",
  model: null,
  selected: null,
  facts: { profiles: [], tolerances: {}, limits: {} },
};

export class ApiError extends Error {
  constructor(status, body, path) {
    super(body?.error ? body.error : `HTTP ${status} from ${path}`);
    this.status = status;
    this.body = body;
  }
}

// content key -> {spec, tensor (its smallest)}: what re-registers a key the server forgot
const knownSpecs = new Map();
// content key -> the table URL the server handed out (/v1/tables/{key}.{spec}: the spec rides
// in the URL, so any replica answers it, after any restart), relative to the page
export const knownUrls = new Map();

export function remember(key, spec, outputs, url) {
  const sizes = Object.entries(outputs || {}).map(([n, o]) => [n, o.shape.reduce((a, b) => a * b, 1)]);
  sizes.sort((a, b) => a[1] - b[1]);
  if (sizes.length) knownSpecs.set(key, { spec, tensor: sizes[0][0] });
  if (url?.startsWith(`/v1/tables/${key}.`)) knownUrls.set(key, url.slice(1));
}

export const tableUrl = (key, params) =>
  `${knownUrls.get(key) || `v1/tables/${key}`}${params ? `?${new URLSearchParams(params)}` : ""}`;

export async function call(path, { method = "GET", body, accept } = {}) {
  const headers = {};
  if (session.apiKey) headers.Authorization = `Bearer ${session.apiKey}`;
  if (accept) headers.Accept = accept;
  const init = { method, headers };
  const binary = body instanceof Blob;
  if (binary) {
    headers["Content-Type"] = "application/octet-stream";
    init.body = body;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  let response = await fetch(path, init);
  // A key this server does not know (another replica resolved it, or it left the server's
  // LRU of keys): POST its spec again, asking for one byte, and retry (a GET, or a file sent
  // to the check route, which can be sent again).
  for (let attempt = 0; attempt < 3 && response.status === 404 && (method === "GET" || binary); attempt += 1) {
    const found = /v1\/tables\/([0-9a-f]{64})|[?&]key=([0-9a-f]{64})/.exec(path);
    const spec = found && knownSpecs.get(found[1] || found[2]);
    if (!spec) break;
    const again = await fetch(`v1/tables?format=raw&tensor=${encodeURIComponent(spec.tensor)}`, {
      method: "POST",
      body: JSON.stringify(spec.spec),
      headers: { ...headers, "Content-Type": "application/json", Range: "bytes=0-0" },
    });
    if (!again.ok) break;
    response = await fetch(path, init);
  }
  if (!response.ok) {
    let parsed = null;
    try {
      parsed = await response.json();
    } catch (_) {
      parsed = null;
    }
    throw new ApiError(response.status, parsed, path);
  }
  return response;
}

export const getJSON = async (path, options) => (await call(path, options)).json();

// The profiles, tolerances and limits of GET /v1/kinds.
export async function loadFacts() {
  const body = await getJSON("v1/kinds");
  session.facts = {
    profiles: body.profiles || [],
    tolerances: body.tolerances || {},
    limits: body.limits || {},
  };
  return session.facts;
}

// A table over the server's max_response_bytes is refused whole (413): no download of it.
export function overLimit(bytes) {
  const limit = session.facts.limits.max_response_bytes;
  return typeof limit === "number" && bytes > limit;
}

// The path segment naming a table: `{key}.{spec}` as the server handed it out, or the key.
const segment = (key) => tableUrl(key).slice("v1/tables/".length);

// One tensor sampled to at most maxPoints elements, with min/max/mean over each sample's block;
// with `minus` (another table's key), of this tensor minus that one's, with maxabs per block.
export async function preview(key, tensor, rows, maxPoints = PREVIEW_POINTS, minus = null) {
  const params = { tensor, max_points: maxPoints, pool: "block" };
  if (rows) params.rows = `${rows[0]}:${rows[1]}`;
  if (minus) params.minus = segment(minus);
  return getJSON(`${tableUrl(key)}/preview?${new URLSearchParams(params)}`);
}

export async function tensorJSON(key, tensor, rows) {
  const params = { format: "json", tensor };
  if (rows) params.rows = `${rows[0]}:${rows[1]}`;
  const body = await getJSON(tableUrl(key, params));
  return { ...body.tensors[tensor], meta: body.meta || {} };
}

// POST a spec, ask for one small tensor as JSON: the table's key (X-Posenc-Key), that tensor,
// the table's shapes and the URL the server handed out.
export async function postSpec(spec, tensor, rows) {
  const params = { format: "json", tensor };
  if (rows) params.rows = `${rows[0]}:${rows[1]}`;
  const response = await call(`v1/tables?${new URLSearchParams(params)}`, { method: "POST", body: spec });
  const body = await response.json();
  const key = response.headers.get("X-Posenc-Key");
  const shapes = body.meta?.shapes
    ? Object.fromEntries(
        Object.entries(body.meta.shapes).map(([n, shape]) => [n, { shape, dtype: body.meta.dtypes?.[n] }]),
      )
    : { [tensor]: { shape: [1] } };
  const url = response.headers.get("Content-Location");
  remember(key, spec, shapes, url);
  return { key, tensor: body.tensors[tensor], outputs: shapes, meta: body.meta || {}, url };
}
