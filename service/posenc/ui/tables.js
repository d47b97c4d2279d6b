// Typed arrays out of raw table bytes, and tables out of .npy and .safetensors files.

function half(bits) {
  const s = bits & 0x8000 ? -1 : 1;
  const e = (bits >> 10) & 0x1f;
  const f = bits & 0x3ff;
  if (e === 0) return s * 2 ** -14 * (f / 1024);
  if (e === 31) return f ? Number.NaN : s * Number.POSITIVE_INFINITY;
  return s * 2 ** (e - 15) * (1 + f / 1024);
}

export function typed(buffer, offset, length, dtype) {
  const bytes = buffer.slice(offset, offset + length);
  switch (dtype) {
    case "float32":
      return new Float32Array(bytes);
    case "float64":
      return new Float64Array(bytes);
    case "int32":
      return new Int32Array(bytes);
    case "int64":
      return Float64Array.from(new BigInt64Array(bytes), Number);
    case "float16":
      return Float32Array.from(new Uint16Array(bytes), half);
    case "bfloat16": {
      const out = new Uint32Array(length / 2);
      new Uint16Array(bytes).forEach((v, i) => {
        out[i] = v << 16;
      });
      return new Float32Array(out.buffer);
    }
    default:
      throw new Error(`dtype ${dtype} is not read here (float16/32/64, bfloat16, int32/64 are)`);
  }
}

const NPY_DTYPES = { "<f4": "float32", "<f8": "float64", "<f2": "float16", "<i4": "int32", "<i8": "int64" };
const ST_DTYPES = { F32: "float32", F64: "float64", F16: "float16", BF16: "bfloat16", I32: "int32", I64: "int64" };

function readNpy(buffer, view, fileName) {
  const major = view.getUint8(6);
  const headerLength = major === 1 ? view.getUint16(8, true) : view.getUint32(8, true);
  const start = major === 1 ? 10 : 12;
  const header = new TextDecoder().decode(new Uint8Array(buffer, start, headerLength));
  const descr = /'descr':\s*'([^']+)'/.exec(header);
  const fortran = /'fortran_order':\s*(True|False)/.exec(header);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header);
  if (!descr || !fortran || !shape) throw new Error(`${fileName}: not a readable .npy header`);
  if (fortran[1] === "True") throw new Error(`${fileName}: Fortran-ordered arrays are not read; save it C-ordered`);
  const dtype = NPY_DTYPES[descr[1].replace("|", "<")];
  if (!dtype) throw new Error(`${fileName}: dtype ${descr[1]} is not read here`);
  const dims = shape[1]
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean)
    .map(Number);
  const offset = start + headerLength;
  const length = buffer.byteLength - offset;
  return {
    array: {
      dtype,
      shape: dims,
      values: typed(buffer, offset, length, dtype),
      raw: new Uint8Array(buffer, offset, length),
    },
  };
}

// {name: {dtype, shape, values, raw}} from an .npy or .safetensors file.
export function readTables(buffer, fileName) {
  const view = new DataView(buffer);
  const magic = new Uint8Array(buffer, 0, Math.min(6, buffer.byteLength));
  if (magic[0] === 0x93 && String.fromCharCode(...magic.slice(1)) === "NUMPY") return readNpy(buffer, view, fileName);
  if (buffer.byteLength > 8 && view.getUint8(8) === 0x7b) {
    const length = Number(view.getBigUint64(0, true));
    const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 8, length)));
    const out = {};
    for (const [name, info] of Object.entries(header)) {
      if (name === "__metadata__") continue;
      const dtype = ST_DTYPES[info.dtype];
      if (!dtype) continue;
      const [a, b] = info.data_offsets;
      out[name] = {
        dtype,
        shape: info.shape,
        values: typed(buffer, 8 + length + a, b - a, dtype),
        raw: new Uint8Array(buffer, 8 + length + a, b - a),
      };
    }
    return out;
  }
  throw new Error(`${fileName} is neither .npy nor .safetensors`);
}
