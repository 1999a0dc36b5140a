/**
 * A server-sent events parser (WHATWG HTML, "Parsing an event stream"): bytes in, in chunks cut
 * anywhere (inside a line, a CRLF or a UTF-8 character), events out. An event is dispatched at
 * the blank line that ends it, also one that has only an `id:`, so that its id counts.
 */

export interface SseEvent {
  /** The block's `id:`, or `undefined` when it had none. */
  id: string | undefined;
  /** The block's `event:`, `"message"` when it had none. */
  event: string;
  data: string;
}

export class SseParser {
  #decoder = new TextDecoder("utf-8");
  #buf = "";
  #start = true;
  #crPending = false;
  #id: string | undefined = undefined;
  #event = "";
  #data: string[] = [];
  #any = false;

  /** Feeds a chunk of the stream; returns the events it completed. */
  push(chunk: Uint8Array): SseEvent[] {
    return this.#text(this.#decoder.decode(chunk, { stream: true }));
  }

  /** Feeds text (already decoded); returns the events it completed. */
  pushText(text: string): SseEvent[] {
    return this.#text(text);
  }

  #text(text: string): SseEvent[] {
    if (this.#start && text.length > 0) {
      this.#start = false;
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
    }
    if (text.length === 0) return [];
    if (this.#crPending && text.startsWith("\n")) text = text.slice(1);
    this.#crPending = false;
    this.#buf += text;
    const out: SseEvent[] = [];
    for (;;) {
      const m = /\r\n|\r|\n/.exec(this.#buf);
      if (m === null) break;
      // A CR at the very end may be the first half of a CRLF split across chunks.
      if (m[0] === "\r" && m.index === this.#buf.length - 1) this.#crPending = true;
      const line = this.#buf.slice(0, m.index);
      this.#buf = this.#buf.slice(m.index + m[0].length);
      const ev = this.#line(line);
      if (ev !== undefined) out.push(ev);
    }
    return out;
  }

  #line(line: string): SseEvent | undefined {
    if (line === "") {
      if (!this.#any) return undefined;
      const ev: SseEvent = { id: this.#id, event: this.#event || "message", data: this.#data.join("\n") };
      this.#id = undefined;
      this.#event = "";
      this.#data = [];
      this.#any = false;
      return ev;
    }
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const name = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (name) {
      case "id":
        if (!value.includes("\0")) {
          this.#id = value;
          this.#any = true;
        }
        break;
      case "event":
        this.#event = value;
        this.#any = true;
        break;
      case "data":
        this.#data.push(value);
        this.#any = true;
        break;
    }
    return undefined;
  }
}
