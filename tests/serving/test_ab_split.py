"""Two models behind one route, `--split A=90,B=10`, counted in /metrics.

One tiny language model (context 64, vocab 512) is served twice, as A and B, from the
same SavedModel: what is measured is the routing and the counting, not the models.
1,000 TF Serving requests, each with its own X-Session-Id, go to the split's route
(`/v1/models/deepseek:predict`, signature `tokenize`, the cheapest); /metrics, read back
with prometheus_client's own parser, must count them per model, adding up to what was
sent, in shares within 90 +- 3%. OpenAI requests with a `user` are sticky.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tiny_text_model import save_tiny_text_model

from config import ServeConfig
from serving.http_app import PREDICT_ROUTE, make_app, serving_in_thread
from serving.model_split import parse_split
from serving.served_models import ServedModels
from serving.server import ModelServer

pytestmark = pytest.mark.slow  # one tiny model exported and loaded twice (~30 s)

REQUESTS = 1000


@pytest.fixture(scope="module")
def split_server(tmp_path_factory):
    """(base URL, ServedModels) of A and B (one tiny model, loaded twice), split 90/10."""
    from tokenization.byte_level_bpe import ByteLevelBpe
    from tokenization.tokenizer import learn

    units = {"the": 40, " the": 60, " quick": 12, " fox": 9, "床前": 5, "明月光": 5}
    out = save_tiny_text_model(tmp_path_factory.mktemp("ab") / "saved",
                               ByteLevelBpe(learn(units, 300).json), context=64,
                               max_new_tokens=4)
    serve = ServeConfig(max_batch_size=8, batch_timeout_micros=1000)
    servers = {name: ModelServer(str(out), name, serve) for name in ("A", "B")}
    models = ServedModels(servers, parse_split("A=90,B=10", servers), "deepseek")
    try:
        with serving_in_thread(make_app(models), serve) as port:
            yield f"http://127.0.0.1:{port}", models
    finally:
        models.close()


def _post(url: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, json.loads(response.read())


def _metrics(base: str) -> dict:
    """{(metric sample name, labels as a sorted tuple): value} from /metrics."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _requests_of(samples: dict, model: str, route: str, code: str = "200") -> float:
    return samples.get(("deepseek_tfx_requests_total",
                        (("code", code), ("model", model), ("route", route))), 0.0)


def test_a_90_10_split_shares_traffic_and_metrics_add_up(split_server):
    base, _ = split_server
    before = _metrics(base)

    def one(i: int) -> int:
        status, reply = _post(f"{base}/v1/models/deepseek:predict",
                              {"signature_name": "tokenize", "instances": ["the quick fox"]},
                              {"X-Session-Id": f"user-{i}"})
        assert reply["predictions"][0]["lengths"] > 0
        return status

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(one, range(REQUESTS))) == [200] * REQUESTS
    after = _metrics(base)
    sent = {m: _requests_of(after, m, PREDICT_ROUTE) - _requests_of(before, m, PREDICT_ROUTE)
            for m in ("A", "B")}
    assert sent["A"] + sent["B"] == REQUESTS  # every request counted once, under its model
    assert abs(sent["A"] / REQUESTS - 0.90) <= 0.03, sent
    # tokens in are counted per model too (tokenize: its input ids are not a prompt's
    # generation, so only requests with token ids or generation add to them)
    for model in ("A", "B"):
        assert ("deepseek_tfx_queue_depth", (("model", model),)) in after
        batches = after[("deepseek_tfx_batch_size_count", (("model", model),))]
        assert batches >= 1


def test_the_same_user_always_gets_the_same_model(split_server):
    base, models = split_server
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    for user in ("alice", "bob", "王小明", "carol"):
        answered = {client.completions.create(model="deepseek", prompt="the", max_tokens=2,
                                              temperature=0, user=user).model
                    for _ in range(4)}
        assert answered == {models.split.choose(user)}, user
    # by name, each model is reachable whatever the split
    assert client.completions.create(model="B", prompt="the", max_tokens=1).model == "B"


def test_status_of_the_split_route_and_unknown_names(split_server):
    base, _ = split_server
    with urllib.request.urlopen(f"{base}/v1/models/deepseek", timeout=30) as response:
        status = json.loads(response.read())
    assert status["model_version_status"][0]["state"] == "AVAILABLE"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{base}/v1/models/C", timeout=30)
    assert e.value.code == 404 and "'C'" in json.loads(e.value.read())["error"]
