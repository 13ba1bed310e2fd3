"""The OpenAI streaming scenarios of `serve_load.py --openai`, against one running server.

`run_scenarios(base, facts, plan, engine=...)` streams /v1/completions over plain HTTP
(httpx, server-sent events) and times each reply from the client's side: TTFT = the
first chunk with non-empty text, inter-token latency (ITL) = the gaps between text
chunks, e2e = the end of the stream; `usage` (stream_options.include_usage) counts the
completion tokens. `print_report(reports)` prints the tables and the engine/batcher
ratios. `serve_load.py` starts and stops the servers; nothing here does.
"""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

MODEL_NAME = "deepseek"
CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "corpora" / "tinyshakespeare.txt"
SEED_POOL = 128  # seeds whose reply lengths `generate` is asked for (batcher-comparable)


# ----------------------------------------------------------------------------- the model


@dataclasses.dataclass
class ModelFacts:
    """What the benchmark reads from the served model's newest version."""
    version_dir: Path
    context: int  # max_position_embeddings
    eos_id: int
    tokenizer: object  # tokenizers.Tokenizer


def model_facts(serving_dir: str) -> ModelFacts:
    """The newest numbered version of `serving_dir`: its context, EOS id and tokenizer."""
    import tokenizers

    root = Path(serving_dir)
    versions = [int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit()]
    version = root / str(max(versions)) if versions else root
    extra = version / "assets.extra"
    context = json.loads((extra / "config.json").read_text())["max_position_embeddings"]
    generation = extra / "generation_config.json"
    eos = json.loads(generation.read_text()).get("eos_token_id") if generation.exists() else None
    if isinstance(eos, list):
        eos = eos[0]
    if eos is None:  # imports TensorFlow: only when generation_config.json does not say
        from savedmodel.layout import read_tokenizer
        eos = read_tokenizer(str(version)).eos_id
    tokenizer = tokenizers.Tokenizer.from_file(str(version / "assets" / "tokenizer.json"))
    return ModelFacts(version, int(context), int(eos), tokenizer)


def build_prompt(tokenizer, tokens: int, offset: int = 2000) -> tuple[str, int]:
    """(Tiny Shakespeare text from the first speech after `offset` characters, cut to
    `tokens` tokens; its token count re-encoded)."""
    corpus = CORPUS.read_text(encoding="utf-8")
    start = corpus.index("\n\n", offset) + 2
    text = corpus[start:start + 40 * max(tokens, 1)]
    ids = tokenizer.encode(text, add_special_tokens=False).ids[:tokens]
    prompt = tokenizer.decode(ids)
    return prompt, len(tokenizer.encode(prompt, add_special_tokens=False).ids)


@dataclasses.dataclass
class Plan:
    """The run's sizes, clipped to the model's context (`notes` says what was clipped)."""
    prompt: str
    prompt_tokens: int  # as the model reads it: [EOS] + the prompt's ids
    room: int  # context - prompt_tokens: the most max_tokens
    long: int  # max_tokens of scenarios 1, 3 and 4
    lengths: list[int]  # scenario 2's max_tokens, one per request
    concurrency: list[int]
    requests: int
    notes: list[str]
    seed: int = 0
    seed_lengths: dict[int, int] = dataclasses.field(default_factory=dict)


def make_plan(facts: ModelFacts, prompt_tokens: int, requests: int, concurrency: list[int],
              seed: int) -> Plan:
    """Prompt and reply lengths within the context; prints nothing, notes what it clipped."""
    notes = []
    most = facts.context - 1 - 16  # [EOS] + prompt, and room for scenario 3's 16 tokens
    if prompt_tokens > most:
        notes.append(f"prompt {prompt_tokens} -> {most} tokens (context {facts.context})")
        prompt_tokens = most
    prompt, n = build_prompt(facts.tokenizer, prompt_tokens)
    room = facts.context - (n + 1)
    wanted = {"scenario 1 max_tokens": 256, "scenarios 3-4 max_tokens": 512}
    for what, value in wanted.items():
        if value > room:
            notes.append(f"{what} {value} -> {room} (prompt {n} + [EOS] of a "
                         f"{facts.context}-token context)")
    rng = random.Random(seed)
    drawn = [rng.randint(8, 512) for _ in range(requests)]
    clipped = sum(d > room for d in drawn)
    if clipped:
        notes.append(f"scenario 2: {clipped} of {requests} reply lengths drawn from 8..512 "
                     f"clipped to {room}")
    return Plan(prompt, n + 1, room, min(512, room), [min(d, room) for d in drawn],
                concurrency, requests, notes, seed)


# ----------------------------------------------------------------------------- streaming


@dataclasses.dataclass
class Reply:
    """One streamed completion as the client saw it (seconds from sending)."""
    status: int = 0
    ttft: float | None = None
    gaps: list[float] = dataclasses.field(default_factory=list)
    e2e: float = 0.0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None


def _read_events(response, reply: Reply, start: float, first_only: bool, on_first) -> None:
    last = None
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            return
        chunk = json.loads(line[6:])
        if "error" in chunk:
            reply.error = json.dumps(chunk["error"])[:300]
        if chunk.get("usage"):
            reply.completion_tokens = chunk["usage"]["completion_tokens"]
            reply.prompt_tokens = chunk["usage"]["prompt_tokens"]
        for choice in chunk.get("choices", []):
            reply.finish_reason = choice.get("finish_reason") or reply.finish_reason
        text = "".join(c.get("text") or "" for c in chunk.get("choices", []))
        if not text:
            continue
        now = time.perf_counter()
        if last is None:
            reply.ttft = now - start
            if on_first is not None:
                on_first()
        else:
            reply.gaps.append(now - last)
        last, reply.text = now, reply.text + text
        if first_only:
            return  # leaving the `with` closes the connection: a client that went away


def stream(url: str, body: dict, first_only: bool = False, on_first=None,
           timeout: float = 600.0) -> Reply:
    """POSTs `body` (stream: true) to `url` and reads its events; never raises."""
    reply = Reply()
    start = time.perf_counter()
    try:
        with httpx.stream("POST", url, json=body, timeout=timeout) as response:
            reply.status = response.status_code
            if response.status_code != 200:
                reply.error = response.read().decode("utf-8", "replace")[:300]
            else:
                _read_events(response, reply, start, first_only, on_first)
    except (httpx.HTTPError, ValueError) as e:
        reply.error = f"{type(e).__name__}: {e}"
    reply.e2e = time.perf_counter() - start
    return reply


class Client:
    """Request bodies and calls of one server (`bias`: send logit_bias against EOS)."""

    def __init__(self, base: str, plan: Plan, eos_id: int, bias: bool):
        self.base, self.plan, self.eos_id, self.bias = base, plan, eos_id, bias
        self.url = base + "/v1/completions"

    def body(self, max_tokens: int, seed: int, **more) -> dict:
        body = {"model": MODEL_NAME, "prompt": self.plan.prompt, "max_tokens": max_tokens,
                "temperature": 1.0, "seed": seed, "stream": True,
                "stream_options": {"include_usage": True}, **more}
        if self.bias and more.get("temperature", 1.0) != 0:
            body["logit_bias"] = {str(self.eos_id): -100}
        return body

    def seed_for(self, max_tokens: int, i: int) -> int:
        """A seed whose unbiased reply (`generate`'s) runs to `max_tokens`, the i-th such
        (cycling), else the longest: so the batcher's replies run as long as the engine's."""
        lengths = self.plan.seed_lengths
        if not lengths:
            return self.plan.seed + i
        fit = sorted(s for s, n in lengths.items() if n >= max_tokens)
        return fit[i % len(fit)] if fit else max(lengths, key=lengths.get)

    def one(self, max_tokens: int, i: int = 0, **kw) -> Reply:
        return stream(self.url, self.body(max_tokens, self.seed_for(max_tokens, i)), **kw)

    def predict(self, max_new_tokens: int, seeds: list[int]) -> tuple[float, list[int]]:
        """(seconds, num_generated per seed) of one `generate` call on the predict route."""
        rows = [{"prompt": self.plan.prompt, "max_new_tokens": max_new_tokens,
                 "temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": s} for s in seeds]
        start = time.perf_counter()
        r = httpx.post(f"{self.base}/v1/models/{MODEL_NAME}:predict", timeout=600,
                       json={"signature_name": "generate", "instances": rows})
        seconds = time.perf_counter() - start
        r.raise_for_status()
        return seconds, [int(p["num_generated"]) for p in r.json()["predictions"]]


def seed_lengths(client: Client, max_new_tokens: int, count: int = SEED_POOL) -> dict[int, int]:
    """{seed: tokens `generate` makes before EOS, at most max_new_tokens}, 32 rows a call."""
    seeds = [client.plan.seed + i for i in range(count)]
    lengths = {}
    for start in range(0, count, 32):
        _, made = client.predict(max_new_tokens, seeds[start:start + 32])
        lengths.update(zip(seeds[start:start + 32], made, strict=True))
    return lengths


# ----------------------------------------------------------------------------- statistics


def _ms(values, q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 1) if len(values) else None


def summarize(replies: list[Reply], wall: float, asked: list[int]) -> dict:
    """TTFT and ITL p50/p99 (ms), tokens/s, mean tokens per reply, short replies, errors."""
    ok = [r for r in replies if r.error is None and r.status == 200]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    gaps = [g for r in ok for g in r.gaps]
    tokens = sum(r.completion_tokens for r in ok)
    statuses: dict[str, int] = {}
    for r in replies:
        statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
    return {"ttft_p50_ms": _ms(ttfts, 50), "ttft_p99_ms": _ms(ttfts, 99),
            "itl_p50_ms": _ms(gaps, 50), "itl_p99_ms": _ms(gaps, 99),
            "e2e_p50_ms": _ms([r.e2e for r in ok], 50),
            "tokens_per_second": round(tokens / wall, 1) if wall else None,
            "tokens_per_reply": round(tokens / max(len(ok), 1), 1),
            "short_replies": sum(r.completion_tokens < n for r, n in zip(replies, asked,
                                                                          strict=True)),
            "errors": len(replies) - len(ok), "statuses": statuses,
            "first_error": next((r.error for r in replies if r.error), None)}


def run_level(client: Client, lengths: list[int], concurrency: int) -> dict:
    """`len(lengths)` streams, at most `concurrency` at a time; their summary."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        replies = list(pool.map(lambda i: client.one(lengths[i], i), range(len(lengths))))
    level = summarize(replies, time.perf_counter() - start, lengths)
    return {"concurrency": concurrency, "requests": len(lengths), **level}


# ----------------------------------------------------------------------------- scenarios


def ttft_solo(client: Client, count: int = 10) -> dict:
    """1. TTFT at concurrency 1 with the `--context-prompt-tokens` prompt; TTFT's share
    of each reply's e2e (p50)."""
    n = min(256, client.plan.room)
    before = metrics(client.base)
    replies = [client.one(n, i) for i in range(count)]
    shares = [r.ttft / r.e2e for r in replies if r.ttft is not None and r.e2e]
    return {"max_tokens": n, **summarize(replies, sum(r.e2e for r in replies), [n] * count),
            "ttft_share_p50": round(float(np.median(shares)), 4) if shares else None,
            **engine_means(before, metrics(client.base))}


def _in_thread(fn, out: list, k: int) -> threading.Thread:
    thread = threading.Thread(target=lambda: out.__setitem__(k, fn()), daemon=True)
    thread.start()
    return thread


def long_then_long(client: Client, delay_s: float = 0.3) -> dict:
    """3a. A long request, and the same request `delay_s` later: each one's e2e."""
    n = client.plan.long
    body = client.body(n, client.seed_for(n, 0))
    out: list = [None, None]
    first = _in_thread(lambda: stream(client.url, body), out, 0)
    time.sleep(delay_s)
    second = _in_thread(lambda: stream(client.url, body), out, 1)
    first.join()
    second.join()
    a, b = out
    return {"max_tokens": n, "tokens": [a.completion_tokens, b.completion_tokens],
            "first_e2e_ms": round(a.e2e * 1000, 1), "second_e2e_ms": round(b.e2e * 1000, 1),
            "second_ttft_ms": round(b.ttft * 1000, 1) if b.ttft is not None else None,
            "ratio": round(b.e2e / a.e2e, 3), "errors": [r.error for r in out if r.error]}


def short_during_long(client: Client, wait_s: float = 1.0, short: int = 16) -> dict:
    """3b. A `short`-token request sent once two long requests have streamed their first
    token (or `wait_s` after sending them: the batcher streams only at the end): its e2e
    against its e2e alone (p50 of 3)."""
    solo = float(np.median([client.one(short, i).e2e for i in range(3)]))
    n = client.plan.long
    started = [threading.Event(), threading.Event()]
    longs: list = [None, None]
    threads = [_in_thread(lambda k=k: stream(client.url, client.body(
        n, client.seed_for(n, k)), on_first=started[k].set), longs, k) for k in range(2)]
    t0 = time.perf_counter()
    for event in started:
        event.wait(max(0.0, wait_s - (time.perf_counter() - t0)))
    sent_after = time.perf_counter() - t0
    streaming = all(e.is_set() for e in started)
    reply = client.one(short, 0)
    longs_running = any(t.is_alive() for t in threads)
    for t in threads:
        t.join()
    return {"short_tokens": reply.completion_tokens, "long_max_tokens": n,
            "sent_after_ms": round(sent_after * 1000, 1), "longs_had_streamed": streaming,
            "longs_running_at_its_end": longs_running,
            "e2e_ms": round(reply.e2e * 1000, 1), "solo_e2e_ms": round(solo * 1000, 1),
            "ratio": round(reply.e2e / solo, 3),
            "errors": [r.error for r in [reply, *longs] if r.error]}


def per_token_decode(client: Client, repeats: int = 3) -> dict:
    """4. A single long stream's ITL p50 against `generate`'s per-token time on the
    predict route: (t(N) - t(N/2)) / (tokens(N) - tokens(N/2)), medians of `repeats`."""
    n = client.plan.long - client.plan.long % 2
    seed = client.seed_for(n, 0)
    times: dict[int, list[float]] = {n: [], n // 2: []}
    made: dict[int, int] = {}
    for _ in range(repeats):
        for m in times:
            seconds, [made[m]] = client.predict(m, [seed])
            times[m].append(seconds)
    extra = made[n] - made[n // 2]
    per_token = ((np.median(times[n]) - np.median(times[n // 2])) / extra) if extra > 0 else None
    before = metrics(client.base)
    replies = [stream(client.url, client.body(n, seed)) for _ in range(repeats)]
    server = engine_means(before, metrics(client.base))
    gaps = [g for r in replies for g in r.gaps]
    itl = _ms(gaps, 50)
    gen_ms = round(float(per_token) * 1000, 2) if per_token is not None else None
    return {"max_tokens": n, "seed": seed, "generate_tokens": [made[n], made[n // 2]],
            "generate_ms": [round(float(np.median(times[m])) * 1000, 1) for m in times],
            "generate_ms_per_token": gen_ms, "stream_itl_p50_ms": itl,
            "stream_tokens": [r.completion_tokens for r in replies],
            "server_itl_mean_ms": server["server_inter_token_latency_mean_ms"],
            "itl_over_generate": round(itl / gen_ms, 3) if itl and gen_ms else None}


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def metrics(base: str) -> dict[str, float]:
    """/metrics summed over labels, by metric name; `5xx`: the 5xx answers counted."""
    totals: dict[str, float] = {"5xx": 0.0}
    for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        totals[name.split("{")[0]] = totals.get(name.split("{")[0], 0.0) + float(value)
        if name.startswith("deepseek_tfx_requests_total") and 'code="5' in name:
            totals["5xx"] += float(value)
    return totals


def _running(base: str) -> float | None:
    return metrics(base).get("deepseek_tfx_num_requests_running")


def engine_means(before: dict, after: dict) -> dict:
    """The engine's own mean TTFT and ITL (ms) between two `metrics` (None: no engine)."""
    out = {}
    for key in ("time_to_first_token", "inter_token_latency"):
        name = f"deepseek_tfx_{key}_seconds"
        count = after.get(name + "_count", 0) - before.get(name + "_count", 0)
        seconds = after.get(name + "_sum", 0) - before.get(name + "_sum", 0)
        out[f"server_{key}_mean_ms"] = round(seconds / count * 1000, 2) if count else None
    return out


def disconnects(client: Client, pid: int, count: int = 100) -> dict:
    """5. `count` long streams dropped after their first chunk: the server's RSS before
    and after, the running gauge after the last one, TTFT p50 of 10 requests before and
    after."""
    before = [client.one(16, i).ttft for i in range(10)]
    rss_before = _rss_mib(pid)
    dropped = [client.one(client.plan.long, i, first_only=True) for i in range(count)]
    t0 = time.perf_counter()
    first = running = _running(client.base)
    while running and time.perf_counter() - t0 < 5.0:
        time.sleep(0.05)
        running = _running(client.base)
    to_zero = time.perf_counter() - t0 if running == 0 else None
    rss_after = _rss_mib(pid)
    after = [client.one(16, i).ttft for i in range(10)]
    return {"streams": count, "errors": sum(r.error is not None or r.ttft is None
                                           for r in dropped),
            "rss_before_mib": rss_before, "rss_after_mib": rss_after,
            "running_after_last": first, "running_zero_after_s":
                round(to_zero, 3) if to_zero is not None else None,
            "ttft_p50_before_ms": _ms([t for t in before if t is not None], 50),
            "ttft_p50_after_ms": _ms([t for t in after if t is not None], 50)}


def _stop_char(text: str, tokenizer, after: int = 4) -> tuple[str | None, int]:
    """(a character of `text`'s first half that does not occur before it and comes after
    at least `after` tokens, the tokens up to and including it); (None, 0) if none."""
    for i, c in enumerate(text[:len(text) // 2]):
        if c.isspace() or c in text[:i]:
            continue
        upto = len(tokenizer.encode(text[:i + 1], add_special_tokens=False).ids)
        if upto > after:
            return c, upto
    return None, 0


def stop_sequence(client: Client, tokenizer, max_tokens: int = 64) -> dict:
    """6. A greedy completion, then the same with `stop` = a character early in it:
    usage.completion_tokens of each, and the tokens up to the stop (re-tokenized)."""
    m = min(max_tokens, client.plan.room)
    greedy = stream(client.url, client.body(m, 0, temperature=0.0))
    stop, upto = _stop_char(greedy.text, tokenizer)
    report = {"max_tokens": m, "greedy_tokens": greedy.completion_tokens, "stop": stop,
              "greedy_text": greedy.text[:80], "tokens_to_stop": upto}
    if stop is None:
        return report
    stopped = stream(client.url, client.body(m, 0, temperature=0.0, stop=[stop]))
    return {**report, "completion_tokens": stopped.completion_tokens, "text": stopped.text,
            "finish_reason": stopped.finish_reason, "error": stopped.error}


def _bias_accepted(client: Client) -> tuple[bool, str | None]:
    """Whether the server takes logit_bias (the batcher's path answers 400)."""
    reply = stream(client.url, client.body(4, client.plan.seed))
    return reply.status == 200 and reply.error is None, reply.error


def run_scenarios(base: str, facts: ModelFacts, plan: Plan, engine: bool, pid: int,
                  label: str, say=print) -> dict:
    """Every scenario against the server at `base` (disconnects: the engine only)."""
    client = Client(base, plan, facts.eos_id, bias=True)
    client.bias, refusal = _bias_accepted(client)
    report: dict = {"logit_bias": client.bias, "logit_bias_refusal": refusal}
    if not plan.seed_lengths:
        say(f"[{label}] reply lengths of {SEED_POOL} seeds (generate, no logit_bias)")
        plan.seed_lengths = seed_lengths(client, plan.room)
    say(f"[{label}] warm-up")
    run_level(client, plan.lengths[:8], 8)
    client.one(plan.long)
    steps = [("ttft", lambda: ttft_solo(client))]
    steps += [(f"level {c}", lambda c=c: run_level(client, plan.lengths, c))
              for c in plan.concurrency]
    steps += [("long_then_long", lambda: long_then_long(client)),
              ("short_during_long", lambda: short_during_long(client)),
              ("decode", lambda: per_token_decode(client))]
    if engine:
        steps.append(("disconnects", lambda: disconnects(client, pid)))
    steps.append(("stop", lambda: stop_sequence(client, facts.tokenizer)))
    report["levels"] = []
    for name, step in steps:
        say(f"[{label}] {name}")
        result = step()
        if name.startswith("level"):
            report["levels"].append(result)
        else:
            report[name] = result
    report["server_5xx"] = metrics(base)["5xx"]
    return report


# ----------------------------------------------------------------------------- printing


def _f(value, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def _ratio(a, b) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


def print_header(facts: ModelFacts, plan: Plan) -> None:
    lengths = plan.seed_lengths
    print(f"model {facts.version_dir}: context {facts.context}, eos id {facts.eos_id}; prompt "
          f"{plan.prompt_tokens - 1} tokens of Tiny Shakespeare (+ [EOS] = {plan.prompt_tokens})")
    for note in plan.notes:
        print(f"clipped: {note}")
    if lengths:
        full = sum(n >= plan.room for n in lengths.values())
        print(f"seeds: of {len(lengths)} probed, {full} reach {plan.room} tokens without EOS "
              f"(generate, temperature 1; median {np.median(list(lengths.values())):.0f}); "
              "each request uses a seed that reaches its max_tokens when one does")


def _print_levels(report: dict) -> None:
    print(f"2. mixed lengths ({report['levels'][0]['requests']} requests per level):")
    print(f"   {'conc':>4} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} "
          f"{'e2e p50':>8} {'tok/s':>7} {'tok/reply':>9} {'short':>5} {'errors':>6}  (ms)")
    for lv in report["levels"]:
        print(f"   {lv['concurrency']:>4} {_f(lv['ttft_p50_ms']):>9} {_f(lv['ttft_p99_ms']):>9} "
              f"{_f(lv['itl_p50_ms']):>8} {_f(lv['itl_p99_ms']):>8} {_f(lv['e2e_p50_ms']):>8} "
              f"{_f(lv['tokens_per_second']):>7} {lv['tokens_per_reply']:>9} "
              f"{lv['short_replies']:>5} {lv['errors']:>6}")
        if lv["first_error"]:
            print(f"        first error: {lv['first_error']}")


def _print_scenarios(r: dict) -> None:
    t = r["ttft"]
    print(f"1. TTFT, concurrency 1 (10 x max_tokens {t['max_tokens']}): p50 "
          f"{_f(t['ttft_p50_ms'])} ms, p99 {_f(t['ttft_p99_ms'])} ms; e2e p50 "
          f"{_f(t['e2e_p50_ms'])} ms; TTFT share of e2e p50 {_f(t['ttft_share_p50'], '.1%')}; "
          f"{t['tokens_per_reply']} tokens/reply, errors {t['errors']}")
    if t.get("server_time_to_first_token_mean_ms") is not None:
        print(f"   the engine's own mean (from /metrics): TTFT "
              f"{t['server_time_to_first_token_mean_ms']} ms, ITL "
              f"{t['server_inter_token_latency_mean_ms']} ms")
    _print_levels(r)
    j = r["long_then_long"]
    print(f"3a. max_tokens {j['max_tokens']} (tokens {j['tokens']}), the same 0.3 s later: "
          f"e2e {j['first_e2e_ms']} / {j['second_e2e_ms']} ms, second/first {j['ratio']:.2f} "
          f"(second's TTFT {_f(j['second_ttft_ms'])} ms){_errors(j)}")
    s = r["short_during_long"]
    print(f"3b. {s['short_tokens']}-token request sent {s['sent_after_ms']:.0f} ms after two "
          f"long ones (had streamed: {_yes(s['longs_had_streamed'])}; still running at its "
          f"end: {_yes(s['longs_running_at_its_end'])}): e2e {s['e2e_ms']} ms vs alone "
          f"{s['solo_e2e_ms']} ms = {s['ratio']:.2f}x{_errors(s)}")
    d = r["decode"]
    n = d["max_tokens"]
    print(f"4. decode, concurrency 1: stream ITL p50 {_f(d['stream_itl_p50_ms'])} ms "
          f"(tokens {d['stream_tokens']}) vs generate {_f(d['generate_ms_per_token'], '.2f')} "
          f"ms/token (max_new_tokens {n} vs {n // 2}: {d['generate_ms'][0]} vs "
          f"{d['generate_ms'][1]} ms, {d['generate_tokens'][0]} vs {d['generate_tokens'][1]} "
          f"tokens) = {_f(d['itl_over_generate'], '.2f')}x"
          + (f"; the engine's own ITL mean {d['server_itl_mean_ms']} ms"
             if d.get("server_itl_mean_ms") is not None else ""))
    if "disconnects" in r:
        x = r["disconnects"]
        print(f"5. disconnects: {x['streams']} streams dropped after their first chunk "
              f"(errors {x['errors']}): running {_f(x['running_after_last'], 'g')} right after "
              f"the last, 0 after {_f(x['running_zero_after_s'], '.2f')} s; RSS "
              f"{x['rss_before_mib']} -> {x['rss_after_mib']} MiB; TTFT p50 "
              f"{x['ttft_p50_before_ms']} -> {x['ttft_p50_after_ms']} ms")
    p = r["stop"]
    print(f"6. stop {p['stop']!r} (greedy, max_tokens {p['max_tokens']}; {p['greedy_tokens']} "
          f"tokens without stop, ≈{p['tokens_to_stop']} up to the stop): "
          f"usage.completion_tokens {p.get('completion_tokens', '-')}, finish_reason "
          f"{p.get('finish_reason', '-')}, text {p.get('text', '')!r}")


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def _errors(result: dict) -> str:
    return f"; errors: {result['errors']}" if result.get("errors") else ""


def _print_ratios(engine: dict, batcher: dict) -> None:
    print("== engine / batcher")
    a, b = engine["ttft"], batcher["ttft"]
    print(f"1. TTFT p50 {_ratio(a['ttft_p50_ms'], b['ttft_p50_ms'])}; TTFT share "
          f"{_f(a['ttft_share_p50'], '.1%')} vs {_f(b['ttft_share_p50'], '.1%')}")
    for x, y in zip(engine["levels"], batcher["levels"], strict=True):
        print(f"2. concurrency {x['concurrency']:>2}: TTFT p50 "
              f"{_ratio(x['ttft_p50_ms'], y['ttft_p50_ms'])}, p99 "
              f"{_ratio(x['ttft_p99_ms'], y['ttft_p99_ms'])}; ITL p50 "
              f"{_ratio(x['itl_p50_ms'], y['itl_p50_ms'])}; e2e p50 "
              f"{_ratio(x['e2e_p50_ms'], y['e2e_p50_ms'])}; tokens/s "
              f"{_ratio(x['tokens_per_second'], y['tokens_per_second'])} (tokens/reply "
              f"{x['tokens_per_reply']} vs {y['tokens_per_reply']})")
    print(f"3a. second/first e2e: {engine['long_then_long']['ratio']:.2f} vs "
          f"{batcher['long_then_long']['ratio']:.2f}")
    print(f"3b. short-during-long / alone: {engine['short_during_long']['ratio']:.2f} vs "
          f"{batcher['short_during_long']['ratio']:.2f}")
    print(f"4. stream ITL p50: {_f(engine['decode']['stream_itl_p50_ms'])} vs "
          f"{_f(batcher['decode']['stream_itl_p50_ms'])} ms; generate ms/token "
          f"{_f(engine['decode']['generate_ms_per_token'], '.2f')} vs "
          f"{_f(batcher['decode']['generate_ms_per_token'], '.2f')}")
    print(f"6. stop: completion_tokens {engine['stop'].get('completion_tokens', '-')} vs "
          f"{batcher['stop'].get('completion_tokens', '-')}")


def print_report(reports: list[dict]) -> None:
    """One block per server (as run), then the engine/batcher ratios."""
    for r in reports:
        bias = "logit_bias accepted" if r["logit_bias"] else (
            f"logit_bias refused, sent without it: {r['logit_bias_refusal']}")
        print(f"== {r['server']} (serve {' '.join(r['serve_args'])}): startup "
              f"{r['startup_s']} s; {bias}")
        _print_scenarios(r)
        print(f"   5xx answers (/metrics): {r['server_5xx']:g}; server RSS at the end "
              f"{r.get('rss_at_end_mib')} MiB")
        for line in r["server_says"]:
            print(f"   {r['server']} says: {line.strip()}")
    by_name = {r["server"]: r for r in reports}
    if {"engine", "batcher"} <= by_name.keys():
        _print_ratios(by_name["engine"], by_name["batcher"])
