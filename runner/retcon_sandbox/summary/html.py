"""The report (`retcon-sandbox report`): one self-contained HTML page, for a person to look at
after a run or a verification. Pure: facts in, text out.

It needs nothing from a network and runs no script: the style is inline, allowed by its hash in
a Content-Security-Policy that forbids everything else (scripts, images, fonts, frames, forms,
connections, and a style an injected tag could bring). The timeline is inline SVG, drawn with
attributes, not styles. Every value from the repository or its `.git` (subjects, file names,
outputs, labels) goes through `markup.html_text`, so it is text, whatever it holds.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Sequence

from retcon_sandbox import __version__
from retcon_sandbox.markup import html_text as esc
from retcon_sandbox.summary.facts import (
    LANES,
    Commit,
    Facts,
    Logical,
    Timeline,
    final_commit,
    flag_words,
    outcome_line,
    seconds_words,
    stage_words,
)

CSS = """
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--bg:#f6f8fa;--pass:#1a7f37;--fail:#cf222e;
--warn:#9a6700;--claim:#8250df}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);
margin:0 auto;padding:24px;max-width:1280px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:32px 0 10px;padding-bottom:4px;
border-bottom:1px solid var(--line)}h3{font-size:15px;margin:0 0 6px}
code,pre,.sha{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
pre{background:var(--bg);border:1px solid var(--line);border-radius:6px;padding:8px;
overflow:auto;white-space:pre-wrap;word-break:break-all;max-height:420px}
.meta{color:var(--muted);margin:0 0 12px}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid var(--line);border-radius:8px;padding:8px 14px;min-width:120px}
.card b{display:block;font-size:18px}.card span{color:var(--muted);font-size:12px}
.sides{display:grid;grid-template-columns:1fr 1fr;gap:16px}
.side{border:1px solid var(--line);border-radius:8px;padding:10px;min-width:0}
ol.commits{list-style:none;margin:0;padding:0}
ol.commits li{display:flex;gap:8px;align-items:baseline;padding:4px 0;
border-top:1px solid var(--bg);min-width:0}
.subject{flex:1;overflow-wrap:anywhere}.stat{color:var(--muted);white-space:nowrap}
.add{color:var(--pass)}.del{color:var(--fail)}
.badge{display:inline-block;border-radius:10px;padding:0 8px;font-size:12px;font-weight:600;
white-space:nowrap;border:1px solid currentColor}
.pass{color:var(--pass)}.fail{color:var(--fail)}.none{color:var(--muted)}.warn{color:var(--warn)}
.claim{color:var(--claim)}
article{border:1px solid var(--line);border-radius:8px;padding:12px;margin:0 0 12px}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:6px 0}
dt{color:var(--muted)}dd{margin:0;overflow-wrap:anywhere}
ul.flags{margin:4px 0;padding-left:18px}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{background:var(--bg)}td.num,th.num{text-align:right;white-space:nowrap}
td.subject{overflow-wrap:anywhere}
details summary{cursor:pointer}
svg{width:100%;height:auto;border:1px solid var(--line);border-radius:8px}
svg text{font:11px system-ui,sans-serif;fill:var(--muted)}
rect.setup{fill:#bf8700}rect.sandbox{fill:#8c959f}rect.model{fill:#8250df}
rect.build{fill:#0969da}rect.tests{fill:#1a7f37}line.grid{stroke:#eaeef2}
.legend i{display:inline-block;width:10px;height:10px;margin:0 4px 0 12px}
.legend .setup{background:#bf8700}.legend .sandbox{background:#8c959f}
.legend .model{background:#8250df}.legend .build{background:#0969da}
.legend .tests{background:#1a7f37}
footer{margin-top:32px;color:var(--muted);font-size:12px}
@media (max-width:800px){.sides{grid-template-columns:1fr}}
"""
STYLE_HASH = base64.b64encode(hashlib.sha256(CSS.encode("utf-8")).digest()).decode("ascii")
CSP = (f"default-src 'none'; style-src 'sha256-{STYLE_HASH}'; img-src 'none'; "
       "font-src 'none'; connect-src 'none'; frame-src 'none'; object-src 'none'; "
       "base-uri 'none'; form-action 'none'")
FILES_SHOWN = 200  # paths listed per commit


def _badge(text: str) -> str:
    kind = "claim" if "(claim)" in text else "pass" if text.startswith("PASS") else \
        "fail" if text.startswith("FAIL") else "none"
    return f'<span class="badge {kind}">{esc(text)}</span>'


def _mark(commit: Commit) -> str:
    if commit.outcome is None:
        return '<span class="badge none">not verified</span>'
    text = "PASS" if commit.outcome.passed else "FAIL"
    return _badge(text + (" (claim)" if commit.outcome.claimed else ""))


def _stat(commit: Commit) -> str:
    return (f'<span class="stat">{len(commit.files)} file{"s" if len(commit.files) != 1 else ""}'
            f' <span class="add">+{commit.added}</span> <span class="del">−{commit.removed}'
            "</span></span>")


def _commit_line(commit: Commit) -> str:
    return (f'<li><span class="sha">{commit.sha[:7]}</span> '
            f'<span class="subject">{esc(commit.subject, one_line=True)}</span> '
            f"{_stat(commit)} {_mark(commit)}</li>")


def histories(facts: Facts) -> str:
    def side(title: str, name: str, items: Sequence[Commit]) -> str:
        lines = "".join(_commit_line(c) for c in items) or "<li>none</li>"
        return (f'<div class="side"><h3>{title}: <code>{esc(name, one_line=True)}</code> '
                f'({len(items)} commit{"s" if len(items) != 1 else ""})</h3>'
                f'<ol class="commits">{lines}</ol></div>')
    return ('<section id="histories"><h2>The messy and the clean history</h2><div class="sides">'
            + side("messy", facts.source, facts.messy)
            + side("clean", facts.cleaned, facts.clean) + "</div></section>")


def file_table(commit: Commit) -> str:
    rows = "".join(
        f'<tr><td><code>{esc(f.path, one_line=True)}</code></td>'
        + ('<td class="num" colspan="2">binary</td>' if f.added is None else
           f'<td class="num add">+{f.added}</td><td class="num del">−{f.removed}</td>')
        + "</tr>" for f in commit.files[:FILES_SHOWN])
    more = len(commit.files) - FILES_SHOWN
    rows += f'<tr><td colspan="3">… {more} more</td></tr>' if more > 0 else ""
    return (f"<details><summary>{_stat(commit)}</summary><table><tr><th>path</th>"
            f'<th class="num">added</th><th class="num">removed</th></tr>{rows}</table></details>')


def _flags(item: Logical) -> str:
    if not item.flags:
        return "none"
    lines = "".join(
        f'<li>{"<span class=warn>⚠</span> " if f.foreign else ""}<code>'
        f"{esc(f.path, one_line=True)}</code>"
        + (f" ({esc(flag_words(f))})" if flag_words(f) else "")
        + (f"<br>first invented line: <code>{esc(f.first, one_line=True)}</code>"
           if f.first else "") + "</li>" for f in item.flags)
    return f'<ul class="flags">{lines}</ul>'


def logical(facts: Facts, item: Logical) -> str:
    last = final_commit(facts, item)
    outcome = last.outcome if last else None
    mine = [c for c in facts.clean if c.entry == item.number]
    commits = "".join(f'<li><span class="sha">{c.sha[:7]}</span> '
                      f'<span class="subject">{esc(c.subject, one_line=True)}</span> '
                      f"{_mark(c)}{file_table(c)}</li>" for c in mine) or "<li>none</li>"
    state = "pass" if item.state == "complete" else "fail" if item.state == "stuck" else "none"
    seconds = seconds_words(outcome.seconds) if outcome else "-"
    note = f"<pre>{esc(item.note)}</pre>" if item.note else ""
    return (f'<article id="commit-{item.number}"><h3>#{item.number} '
            f'{esc(item.subject, one_line=True)} <span class="badge {state}">'
            f"{esc(item.state)}</span></h3>{note}<dl>"
            f"<dt>build</dt><dd>{_badge(stage_words(outcome, 'build'))}</dd>"
            f"<dt>tests</dt><dd>{_badge(stage_words(outcome, 'test'))}</dd>"
            f"<dt>time</dt><dd>{seconds}</dd><dt>fixes</dt><dd>{item.fixes}</dd>"
            f"<dt>tokens</dt><dd>{item.tokens:,}</dd>"
            f"<dt>content in neither base nor source</dt><dd>{_flags(item)}</dd>"
            f'<dt>commits</dt><dd><ol class="commits">{commits}</ol></dd></dl></article>')


def clean_commits(facts: Facts) -> str:
    if not facts.logical:
        return ""
    warn = ('<p><span class="warn">⚠</span> marks paths that exist in neither the base nor the '
            "source: check them before you push.</p>"
            if any(f.foreign for item in facts.logical for f in item.flags) else "")
    return ('<section id="commits"><h2>The clean commits</h2>' + warn
            + "".join(logical(facts, item) for item in facts.logical) + "</section>")


def _axis(wall: float, width: int, left: int, top: int, bottom: int) -> str:
    step = next((s for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600)
                 if wall / s <= 10), 7200)
    marks = []
    tick = 0
    while tick <= wall:
        x = left + (width - left) * tick / wall
        marks.append(f'<line class="grid" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}"/>'
                     f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">{tick}s</text>')
        tick += step
    return "".join(marks)


def timeline_svg(t: Timeline) -> str:
    width, left, lane_height = 1000, 70, 24
    wall = max(t.wall, 0.001)
    bottom = lane_height * len(LANES) + 6
    parts = [_axis(wall, width, left, 4, bottom)]
    for i, lane in enumerate(LANES):
        y = 6 + i * lane_height
        parts.append(f'<text x="4" y="{y + 15}">{lane}</text>')
        for span in (s for s in t.spans if s.lane == lane):
            x = left + (width - left) * min(span.start, wall) / wall
            w = max(1.0, (width - left) * span.seconds / wall)
            parts.append(f'<rect class="{lane}" x="{x:.1f}" y="{y}" width="{w:.1f}" '
                         f'height="{lane_height - 6}"><title>{esc(span.label, one_line=True)}'
                         f": {span.seconds:.2f} s</title></rect>")
    return (f'<svg viewBox="0 0 {width} {bottom + 20}" role="img" '
            f'aria-label="timeline">{"".join(parts)}</svg>')


def timeline(facts: Facts) -> str:
    t = facts.timeline
    if t is None:
        return ('<section id="timeline"><h2>Where the time went</h2><p>No run of this spec '
                "was recorded here (its events are kept by <code>execute</code>).</p></section>")
    totals = "".join(f'<td class="num">{seconds_words(t.total(lane))}</td>' for lane in LANES)
    legend = "".join(f'<i class="{lane}"></i>{lane}' for lane in LANES)
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t.started))
    return ('<section id="timeline"><h2>Where the time went</h2>'
            f"<p>The last run, started {started}: {seconds_words(t.wall)} of wall time. Work "
            "done ahead (the next sandbox, the next extraction) overlaps.</p>"
            f'<p class="legend">{legend}</p>{timeline_svg(t)}'
            "<table><tr><th>wall</th>" + "".join(f'<th class="num">{lane}</th>' for lane in LANES)
            + f'</tr><tr><td>{seconds_words(t.wall)}</td>{totals}</tr></table></section>')


def _ran(commit: Commit, wanted: tuple[str | None, str | None]) -> str:
    """A result recorded under other commands than the report's, and which."""
    if commit.ran is None or commit.ran == wanted or wanted == (None, None):
        return ""
    build, test = commit.ran
    return (f'<br><span class="badge none">other commands</span> build <code>'
            f"{esc(build or '-', one_line=True)}</code>, tests <code>"
            f"{esc(test or '-', one_line=True)}</code>")


def verify_table(title: str, items: Sequence[Commit], wanted: tuple[str | None, str | None]
                 ) -> str:
    rows = []
    failures = []
    for number, c in enumerate(items, 1):
        o = c.outcome
        rows.append(f'<tr><td class="num">{number}</td><td class="sha">{c.sha[:7]}</td>'
                    f"<td>{_badge(stage_words(o, 'build'))}</td>"
                    f"<td>{_badge(stage_words(o, 'test'))}</td>"
                    f'<td class="num">{seconds_words(o.seconds) if o else "-"}</td>'
                    f'<td class="subject">{esc(c.subject, one_line=True)}{_ran(c, wanted)}'
                    "</td></tr>")
        if o is not None and not o.passed:
            first = (o.failure or "failed").splitlines()[0] if o.failure else "failed"
            failures.append(f"<details><summary>#{number} {c.sha[:7]}: "
                            f"{esc(first, one_line=True)}</summary><pre>{esc(o.tail)}</pre>"
                            "</details>")
    return (f"<h3>{title}</h3><table><tr><th class=num>#</th><th>commit</th><th>build</th>"
            "<th>tests</th><th class=num>time</th><th>subject</th></tr>" + "".join(rows)
            + "</table>" + "".join(failures))


def verification(facts: Facts) -> str:
    build, test = facts.commands
    commands = (f"<p>Results as recorded in <code>refs/notes/retcon-sandbox</code>, for build "
                f"<code>{esc(build or '-', one_line=True)}</code> and tests "
                f"<code>{esc(test or '-', one_line=True)}</code> where recorded so; "
                "<span class=claim>(claim)</span>: a result your key does not authenticate. "
                "Run <code>retcon-sandbox verify</code> for those not verified.</p>")
    tables = verify_table(f"clean: {esc(facts.cleaned, one_line=True)}" if facts.messy
                          else esc(facts.title, one_line=True), facts.clean, facts.commands)
    if facts.messy:
        tables += verify_table(f"messy: {esc(facts.source, one_line=True)}", facts.messy,
                               facts.commands)
    return f'<section id="verify"><h2>Verification</h2>{commands}{tables}</section>'


def cards(facts: Facts) -> str:
    def card(value: str, label: str, kind: str = "") -> str:
        return f'<div class="card {kind}"><b>{value}</b><span>{label}</span></div>'
    passed = sum(1 for c in facts.clean if c.outcome is not None and c.outcome.passed)
    found = [card(f"{passed}/{len(facts.clean)}", "commits passed",
                  "pass" if passed == len(facts.clean) else "fail")]
    if facts.logical:
        complete, line = outcome_line(facts)
        found.insert(0, card("complete" if complete else "not complete", esc(line),
                             "pass" if complete else "fail"))
        found.append(card(str(sum(c.fixes for c in facts.logical)), "fix commits"))
        found.append(card(f"{facts.tokens:,}", "tokens"))
    if facts.tree_equal is not None:
        found.append(card("✓" if facts.tree_equal else f"✗ {facts.differing}",
                          "tree check: cleaned == source" if facts.tree_equal
                          else "paths differ from source", "pass" if facts.tree_equal
                          else "fail"))
    if facts.timeline is not None:
        found.append(card(seconds_words(facts.timeline.wall), "last run"))
    return f'<div class="cards">{"".join(found)}</div>'


def page(facts: Facts) -> str:
    title = esc(facts.title, one_line=True)
    meta = (f"<code>{esc(facts.source, one_line=True)}</code> → <code>"
            f"{esc(facts.cleaned, one_line=True)}</code> onto <code>"
            f"{esc(facts.remote, one_line=True)}</code>, from {facts.base[:7]}"
            if facts.logical else f"{len(facts.clean)} commit(s)")
    body = (cards(facts) + (histories(facts) if facts.messy else "") + clean_commits(facts)
            + (timeline(facts) if facts.logical else "") + verification(facts))
    made = time.strftime("%Y-%m-%d %H:%M:%S")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
            '<meta name="referrer" content="no-referrer">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>retcon-sandbox report: {title}</title>\n<style>{CSS}</style>\n"
            f"</head><body><header><h1>retcon-sandbox report: {title}</h1>"
            f'<p class="meta">{meta}</p></header>{body}'
            f"<footer>Made by retcon-sandbox {esc(__version__)} at {made}. Everything shown "
            "from the repository is text; this page runs no script and loads nothing."
            "</footer></body></html>\n")

