/** Bytes of `n` as a protobuf varint. */
export function varintBytes(n: number): number {
  let len = 1;
  while (n >= 0x80) {
    n = Math.floor(n / 128);
    len++;
  }
  return len;
}

/**
 * Bytes of a length-delimited protobuf field (string, bytes or embedded message) of `n` bytes,
 * empty ones included: one tag byte (field numbers below 16), its length as a varint, the bytes.
 * For upper bounds of encoded sizes without encoding (the config stream's parts and budgets).
 */
export function lenField(n: number): number {
  return 1 + varintBytes(n) + n;
}
