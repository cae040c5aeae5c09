#!/usr/bin/python3
"""The report of `keel compare` in a real browser (headless Chromium, Debian's `chromium`).

Writes synthetic run folders for three variants (a steady run with every metric, one with spike,
skip and rollback events, one that diverged), runs `keel compare --report-only`, then opens
index.html in headless Chromium: the page must log no console message at all (a control page with
a deliberate console.error proves such messages are caught), the DOM must hold the table and the
charts, and a screenshot must show them: many distinct colours, each variant's colour in the
chart region. Chromium missing is a failure, not a skip.

    browser_check.py KEEL_BINARY
Standard library only (the PNG is decoded with zlib).
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

VARIANT_COLORS = {"steady": (0x4E, 0x79, 0xA7), "spiky": (0xF2, 0x8E, 0x2B), "blowup": (0xE1, 0x57, 0x59)}


def fail(msg):
    print("browser_check: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def write_runs(root):
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "base.toml"), "w") as f:
        f.write('[run]\nsteps = 60\n[model]\nconfig = "c.json"\n[data]\ndataset = "d"\n')
    with open(os.path.join(root, "sweep.toml"), "w") as f:
        f.write('[sweep]\nname = "browser check"\ndescription = "three synthetic variants"\nbase = "base.toml"\n'
                '[[variant]]\nname = "steady"\n'
                '[[variant]]\nname = "spiky"\nset = ["optimizer.lr=0.02"]\n'
                '[[variant]]\nname = "blowup"\nset = ["optimizer.lr=1"]\n')
    layers, heads = 4, 4
    for v, (steps, scale) in {"steady": (60, 1.0), "spiky": (60, 1.3), "blowup": (25, 2.0)}.items():
        d = os.path.join(root, "runs", v)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "run.toml"), "w") as f:
            f.write("[run]\nsteps = 60\n")
        lines, events = [], []
        for s in range(1, steps + 1):
            loss = 4.0 * scale / (1 + 0.05 * s) + (3.0 if v == "spiky" and s == 30 else 0)
            line = {"step": s, "tokens": 256 * s, "loss": loss, "ce": loss, "lr": 0.01,
                    "grad_norm": scale * (1 + 0.5 * (s % 7)) / (1 + 0.02 * s),
                    "tokens_per_s": 1000 + 10 * (s % 5), "max_logit": 5 * scale + 0.2 * s * scale,
                    "max_logit_per_head": [[1 + 0.1 * s * scale * (h + 1) / heads + l for h in range(heads)] for l in range(layers)],
                    "update_rms_ratio": 0.01 * scale / (1 + 0.1 * s),
                    "update_rms_ratio_per_layer": [0.01 * (l + 1) for l in range(layers)],
                    "activation_rms": [1 + l * scale + 0.01 * s for l in range(layers)], "skipped": False}
            if s % 10 == 0:
                line["val_loss"] = loss + 0.1
            if v == "spiky" and s == 30:
                ev = {"type": "spike", "signal": "loss", "value": loss, "threshold": 3.5, "action": "rollback"}
                line["events"] = [ev]
                events += [dict(ev, step=30), {"step": 30, "type": "rollback", "to_step": 20}]
            lines.append(json.dumps(line))
        if v == "blowup":
            events.append({"step": 26, "type": "abort", "reason": "non-finite loss"})
            status = {"state": "diverged", "exit_code": 2, "steps_done": steps, "diverged_step": 26, "message": "aborted"}
        else:
            status = {"state": "finished", "exit_code": 0, "steps_done": steps, "message": ""}
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(d, "events.jsonl"), "w") as f:
            f.write("".join(json.dumps(e) + "\n" for e in events))
        with open(os.path.join(d, "sweep_status.json"), "w") as f:
            json.dump(status, f)


def chromium(binary, profile, args, url, timeout=60):
    cmd = [binary, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--disable-extensions",
           "--user-data-dir=" + profile, "--enable-logging=stderr", "--v=0", "--hide-scrollbars"] + args + [url]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        fail("chromium did not finish within %d s: %s" % (timeout, " ".join(cmd)))
    return p


def console_lines(stderr):
    # Every console message (console.error, uncaught exceptions) is logged as "...:CONSOLE..." lines.
    return [l for l in stderr.splitlines() if ":CONSOLE" in l or "Uncaught" in l]


def decode_png(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("the screenshot is not a PNG")
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color_type, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or color_type not in (2, 6) or interlace:
                fail("unexpected PNG format (depth %d, colour type %d, interlace %d)" % (depth, color_type, interlace))
            bpp = 3 if color_type == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(height):
        f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):  # PNG filters: none, sub, up, average, Paeth
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def main():
    if len(sys.argv) != 2:
        fail("usage: browser_check.py KEEL_BINARY")
    keel = sys.argv[1]
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if not binary:
        fail("chromium is not installed: the report must be checked in a real browser. Install Debian's `chromium` "
             "package (scripts/install-deps.sh does: apt-get install --no-install-recommends chromium)")
    tmp = tempfile.mkdtemp(prefix="keel_browser_")
    try:
        write_runs(tmp)
        p = subprocess.run([keel, "compare", os.path.join(tmp, "sweep.toml"), "--report-only"], capture_output=True, text=True)
        if p.returncode != 0:
            fail("keel compare --report-only exited %d: %s" % (p.returncode, p.stderr))
        index = os.path.join(tmp, "report", "index.html")
        html = open(index, encoding="utf-8").read()
        for external in ("src=", "href=", "@import", "url(http"):
            if external in html:
                fail("index.html refers to something outside itself (%r)" % external)

        # Control: a console error must be seen, or the check below would prove nothing.
        control = os.path.join(tmp, "control.html")
        with open(control, "w") as f:
            f.write('<!DOCTYPE html><html><body><script>console.error("keel-control")</script></body></html>')
        c = chromium(binary, os.path.join(tmp, "profile0"), ["--dump-dom"], "file://" + control)
        if not any("keel-control" in l for l in console_lines(c.stderr)):
            fail("the console of the control page was not captured; chromium's stderr:\n" + c.stderr[-2000:])

        d = chromium(binary, os.path.join(tmp, "profile1"), ["--dump-dom", "--virtual-time-budget=2000"], "file://" + index)
        if d.returncode != 0:
            fail("chromium --dump-dom exited %d:\n%s" % (d.returncode, d.stderr[-2000:]))
        errors = console_lines(d.stderr)
        if errors:
            fail("console messages while rendering the report:\n" + "\n".join(errors))
        dom = d.stdout
        if dom.count('class="variant"') != 3:
            fail("the rendered DOM does not hold 3 variant rows")
        if dom.count('class="x-mark"') != 3:  # spiky's spike and rollback, blowup's abort one step past its last line
            fail("the loss chart in the DOM has %d event marks, expected 3" % dom.count('class="x-mark"'))
        if dom.count("<svg") < 9:  # 6 overlays + per-variant heatmaps
            fail("the rendered DOM holds %d SVG charts, expected at least 9" % dom.count("<svg"))

        shot = os.path.join(tmp, "shot.png")
        s = chromium(binary, os.path.join(tmp, "profile2"), ["--screenshot=" + shot, "--window-size=1400,2400"],
                     "file://" + index)
        if not os.path.exists(shot):
            fail("no screenshot written:\n" + s.stderr[-2000:])
        width, height, bpp, rows = decode_png(shot)
        if (width, height) != (1400, 2400):
            fail("screenshot is %dx%d, expected 1400x2400" % (width, height))
        colors, non_white, near = set(), 0, {v: 0 for v in VARIANT_COLORS}
        # Below the header and the table: the chart region.
        for y in range(500, height):
            row = rows[y]
            for x in range(0, width * bpp, bpp):
                rgb = (row[x], row[x + 1], row[x + 2])
                colors.add(rgb)
                if rgb != (255, 255, 255):
                    non_white += 1
                for v, c in VARIANT_COLORS.items():
                    if abs(rgb[0] - c[0]) + abs(rgb[1] - c[1]) + abs(rgb[2] - c[2]) <= 24:
                        near[v] += 1
        share = non_white / (width * (height - 500))
        print("browser_check: %d distinct colours, %.1f%% non-white, variant pixels %s" % (len(colors), 100 * share, near))
        if len(colors) < 200:
            fail("the screenshot has only %d distinct colours: charts not drawn?" % len(colors))
        if share < 0.03:
            fail("the screenshot's chart region is %.2f%% non-white: blank?" % (100 * share))
        for v, n in near.items():
            if n < 40:
                fail("variant %s's colour appears in %d pixels of the chart region (expected its curves)" % (v, n))
        print("browser_check: OK")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
