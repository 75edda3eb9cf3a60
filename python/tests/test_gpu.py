"""The Python face on the device: streams, callbacks, stops, sampling, speculative decoding, the
logits view by DLPack, and a Hugging Face checkpoint against transformers. Skipped (reported as
such) without a CUDA device; scripts/gpu-check.sh runs them with GRAPHDECODE_REQUIRE_GPU=1.
"""

import threading

import pytest

import graphdecode as gd

pytestmark = pytest.mark.gpu

OPTS = dict(max_batch=8, max_context=256, max_step_tokens=64)


@pytest.fixture(scope="module")
def weights():
    return gd.Weights.synthetic(gd.ModelConfig.small_test(), seed=11)


@pytest.fixture(scope="module")
def engine(weights):
    with gd.Engine(weights, **OPTS) as e:
        yield e


@pytest.fixture
def plain_same_gemms(weights, monkeypatch):
    """A plain engine with the GEMM kernels a speculative verify runs, for the tests that compare
    speculative tokens with plain ones exactly: GRAPHDECODE_GEMV=off (read when an engine is made,
    so the speculative engines of the test get it too). Otherwise a plain decode step at <= 4 rows
    takes the stream GEMV (engine/gemm.h), which rounds differently from the verify's cuBLAS GEMM,
    and a near-tie may pick another token."""
    monkeypatch.setenv("GRAPHDECODE_GEMV", "off")
    with gd.Engine(weights, **OPTS) as e:
        yield e


def prompt(n, first=1):
    return [(first + 7 * i) % 200 + 1 for i in range(n)]


def test_stream_yields_every_token_once(engine):
    req = engine.submit(prompt(20), max_new_tokens=12)
    streamed = list(req)
    assert len(streamed) == 12 and streamed == req.tokens and req.finished
    assert all(0 <= t < engine.model_config.vocab_size for t in streamed)
    assert list(req) == []  # a finished stream is exhausted
    assert engine.idle


def test_requests_advance_together_and_callbacks_see_each_token(engine):
    seen = {}

    def on_token(e):
        seen.setdefault(e.request_id, []).append((e.token, e.finished))

    reqs = [engine.submit(prompt(5 + 9 * i, i), max_new_tokens=4 + i, on_token=on_token)
            for i in range(6)]
    first = next(iter(reqs[5]))  # stepping for one request advances the others
    assert first == reqs[5].tokens[0] and len(reqs[0].tokens) >= 1
    engine.run_until_idle()
    for i, r in enumerate(reqs):
        assert r.finished and len(r.tokens) == 4 + i
        assert [t for t, _ in seen[r.id]] == r.tokens
        assert [f for _, f in seen[r.id]] == [False] * (3 + i) + [True]


def test_greedy_is_the_same_with_and_without_graphs(weights, engine):
    prompts = [prompt(3 + 11 * i, i) for i in range(5)]
    graphs = engine.generate(prompts, max_new_tokens=10)
    with gd.Engine(weights, use_graphs=False, **OPTS) as eager:
        assert eager.generate(prompts, max_new_tokens=10) == graphs
        assert eager.stats().graph_steps == 0


def test_stop_tokens_end_a_request(engine):
    tokens = engine.submit(prompt(9), max_new_tokens=16).result()
    stop = tokens[5]
    stopped = engine.submit(prompt(9), max_new_tokens=16, stop_tokens=[stop]).result()
    assert stopped == tokens[: tokens.index(stop) + 1]


def test_sampling_is_reproducible_and_top_k_1_is_greedy(engine):
    greedy = engine.submit(prompt(12), max_new_tokens=10).result()
    s = gd.Sampling(temperature=1.0, top_p=0.9, seed=42)
    a = engine.submit(prompt(12), max_new_tokens=10, sampling=s).result()
    b = engine.submit(prompt(12), max_new_tokens=10, sampling=s).result()
    assert a == b
    c = engine.submit(prompt(12), max_new_tokens=10, temperature=1.0, top_k=1, seed=3).result()
    assert c == greedy


def test_bad_request_is_refused_and_the_engine_keeps_serving(engine):
    ok = engine.submit(prompt(8), max_new_tokens=6)
    with pytest.raises(gd.Error) as info:
        engine.submit([1, engine.model_config.vocab_size + 5], max_new_tokens=4)
    assert info.value.field == "prompt[1]"
    with pytest.raises(gd.Error) as info:
        engine.submit(prompt(200), max_new_tokens=100)  # beyond max_context 256
    assert info.value.field == "prompt_len + max_new_tokens"
    assert len(ok.result()) == 6


def test_a_raising_callback_does_not_lose_other_tokens(engine):
    calls = []

    def boom(e):  # raises at its first token only: the step after it must carry on
        calls.append(e)
        if len(calls) == 1:
            raise RuntimeError("callback failed")

    bad = engine.submit(prompt(4), max_new_tokens=3, on_token=boom)
    good = engine.submit(prompt(6), max_new_tokens=3)
    with pytest.raises(RuntimeError):
        engine.run_until_idle()
    engine.run_until_idle()
    assert bad.finished and good.finished and len(good.tokens) == 3
    assert len(bad.tokens) == 3 and len(calls) == 3 and engine.idle


def test_cancel_stops_a_request_and_frees_it(engine):
    events = []
    long = engine.submit(prompt(10), max_new_tokens=50, on_token=events.append)
    other = engine.submit(prompt(12), max_new_tokens=20)
    it = iter(long)
    first = [next(it), next(it), next(it)]
    long.cancel()
    assert long.finished and long.cancelled and list(it) == []
    assert long.tokens == first and events[-1].cancelled and events[-1].finished
    with pytest.raises(gd.Error) as info:
        engine.cancel(long)
    assert info.value.field == "request"
    assert len(other.result()) == 20 and not other.cancelled

    def cancel_self(e):  # from a callback: after the step's other callbacks
        if len(me.tokens) == 2 and not e.finished:
            engine.cancel(me)

    me = engine.submit(prompt(7), max_new_tokens=30, on_token=cancel_self)
    engine.run_until_idle()
    assert me.cancelled and len(me.tokens) == 2 and engine.idle


def test_stats_count_what_happened(weights):
    with gd.Engine(weights, **OPTS) as e:
        e.generate([prompt(30), prompt(40, 3)], max_new_tokens=8)
        s = e.stats()
    assert s.generated_tokens == 16 and s.finished == 2 and s.prompt_tokens == 70
    assert s.prefill_steps >= 1 and s.decode_steps >= 7 and s.steps == s.prefill_steps + s.decode_steps
    assert s.graph_steps >= 7 and s.decode_p50_us > 0 and s.tokens_per_s > 0


def test_prefix_cache_hits_and_keeps_greedy_tokens(weights):
    # The second wave shares the first request's prompt pages: a hit with the cache on, none off.
    first, wave = prompt(40), [prompt(40) + [3, 4], prompt(57), prompt(33, 9)]
    out = {}
    for cache in (False, True):
        with gd.Engine(weights, prefix_cache=cache, **OPTS) as e:
            out[cache] = e.generate([first], max_new_tokens=6) + e.generate(wave, max_new_tokens=6)
            s = e.stats()
        if cache:
            assert s.prefix_hit_tokens == 32 + 32 and s.prefix_lookup_tokens == 40 + 42 + 57 + 33
            assert s.prefix_cached_pages > 0 and s.prompt_tokens == 40 + 42 + 57 + 33 - 64
        else:
            assert s.prefix_hit_tokens == 0 and s.prompt_tokens == 40 + 42 + 57 + 33
    assert out[True] == out[False]


def test_pipelined_engine_streams_what_the_synchronous_one_does(weights):
    # Stop tokens and lengths end requests at different steps; the pipelined engine delivers the
    # same tokens (a stop seen one step late costs a discarded row, never a delivered token).
    first = prompt(30)
    with gd.Engine(weights, **OPTS) as e:
        plain = e.generate([first], max_new_tokens=12)[0]
    stop = plain[5]
    requests = [dict(prompt=prompt(20 + 7 * i, i), max_new_tokens=4 + 3 * i) for i in range(5)]
    requests.append(dict(prompt=first, max_new_tokens=12, stop_tokens=[stop]))
    out, stats = {}, {}
    for pipelined in (False, True):
        with gd.Engine(weights, pipeline=pipelined, **OPTS) as e:
            handles = [e.submit(r["prompt"], max_new_tokens=r["max_new_tokens"],
                                stop_tokens=r.get("stop_tokens", ())) for r in requests]
            e.run_until_idle()
            out[pipelined] = [h.result() for h in handles]
            stats[pipelined] = e.stats()
    assert out[True] == out[False]
    assert out[True][-1] == plain[:plain.index(stop) + 1]  # the stop token ends the stream
    assert stats[True].pipelined_steps > 0 and stats[False].pipelined_steps == 0
    assert stats[True].device_p50_us > 0


def test_torch_tensors_cross_by_dlpack(engine):
    torch = pytest.importorskip("torch")
    ids = torch.tensor(prompt(10), dtype=torch.int64)
    assert engine.submit(ids, max_new_tokens=5).result() == \
        engine.submit(prompt(10), max_new_tokens=5).result()
    with pytest.raises(gd.Error) as info:
        engine.submit(ids.cuda(), max_new_tokens=5)
    assert info.value.field == "prompt"


def test_logits_view_is_the_device_buffer_and_argmax_is_the_greedy_token(engine):
    torch = pytest.importorskip("torch")
    reqs = [engine.submit(prompt(6 + i, i), max_new_tokens=6) for i in range(3)]
    engine.step()  # prefill
    assert engine.last_step_kind() == "prefill"
    while not all(r.finished for r in reqs):
        before = {r.id: len(r.tokens) for r in reqs}
        engine.step()
        assert engine.last_step_kind() == "decode"
        logits = torch.from_dlpack(engine.last_logits())
        ids = engine.last_step_request_ids()
        assert logits.is_cuda and logits.dtype == torch.float32
        assert logits.shape == (len(ids), engine.model_config.vocab_size)
        by_id = {r.id: r for r in reqs}
        for row, rid in enumerate(ids):
            if rid not in by_id:  # a request another test left running
                continue
            token = by_id[rid].tokens[before[rid]]
            assert int(logits[row].argmax()) == token


def test_step_releases_the_gil(weights):
    # Another Python thread runs while the engine steps: the step holds no GIL.
    with gd.Engine(weights, **OPTS) as e:
        e.submit(prompt(50), max_new_tokens=120)
        ticks = 0
        done = threading.Event()

        def count():
            nonlocal ticks
            while not done.is_set():
                ticks += 1

        t = threading.Thread(target=count)
        t.start()
        e.run_until_idle()
        done.set()
        t.join()
    assert ticks > 0


@pytest.mark.parametrize("use_graphs", [False, True], ids=["eager", "graphs"])
def test_ngram_speculation_keeps_greedy_tokens(weights, plain_same_gemms, use_graphs):
    # A repetitive prompt so prompt lookup proposes something.
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 8, prompt(17)]
    plain = plain_same_gemms.generate(prompts, max_new_tokens=12)
    spec = gd.Speculative(max_draft_tokens=3, proposer="ngram")
    with gd.Engine(weights, speculative=spec, use_graphs=use_graphs, **OPTS) as e:
        assert e.generate(prompts, max_new_tokens=12) == plain
        s = e.stats()
        assert s.spec_rows > 0 and len(s.drafted_at) == 3
        with pytest.raises(gd.Error) as info:
            e.last_logits()
        assert info.value.field == "speculative.max_draft_tokens"


@pytest.mark.parametrize("use_graphs", [False, True], ids=["eager", "graphs"])
def test_draft_model_speculation_with_the_target_as_draft(weights, plain_same_gemms, use_graphs):
    prompts = [prompt(9), prompt(21, 4)]
    plain = plain_same_gemms.generate(prompts, max_new_tokens=8)
    with gd.Engine(weights, draft=weights, speculative=gd.Speculative(max_draft_tokens=2),
                   use_graphs=use_graphs, **OPTS) as e:
        assert e.generate(prompts, max_new_tokens=8) == plain
        s = e.stats()
        assert s.accepted_tokens > 0  # the target drafting for itself is mostly accepted
        assert s.spec_steps > 0 and all(us > 0 for us in s.spec_phase_us)


@pytest.mark.parametrize("use_graphs", [False, True], ids=["eager", "graphs"])
def test_eagle_speculation_keeps_greedy_tokens(weights, plain_same_gemms, use_graphs):
    prompts = [prompt(9), prompt(21, 4), prompt(1)]
    plain = plain_same_gemms.generate(prompts, max_new_tokens=10)
    head = gd.EagleHead.synthetic(weights.config, seed=5)
    spec = gd.Speculative(max_draft_tokens=3, proposer="eagle")
    with gd.Engine(weights, eagle=head, speculative=spec, use_graphs=use_graphs, **OPTS) as e:
        assert e.generate(prompts, max_new_tokens=10) == plain  # a random head: drafts rejected
        s = e.stats()
        assert s.spec_rows > 0 and len(s.drafted_at) == 3
    head3 = gd.EagleHead.synthetic3(weights.config, seed=6)
    with gd.Engine(weights, eagle=head3, speculative=spec, use_graphs=use_graphs, **OPTS) as e:
        assert e.generate(prompts, max_new_tokens=10) == plain  # EAGLE-3: the same, lossless
        assert e.stats().spec_rows > 0
    with pytest.raises(gd.Error) as info:  # the head must fit the target
        gd.Engine(weights, eagle=gd.EagleHead.synthetic(gd.ModelConfig.llama_1b()),
                  speculative=spec, **OPTS)
    assert info.value.field == "eagle.hidden_size"


def test_hugging_face_checkpoint_matches_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=64,
                                      max_position_embeddings=512, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(tmp_path, safe_serialization=True)
    ids = [3, 17, 91, 44, 5, 250, 8, 120]
    with gd.Engine.from_checkpoint(tmp_path, max_batch=2, max_context=128) as e:
        req = e.submit(ids, max_new_tokens=2)
        e.step()  # the prefill: logits of the last prompt position
        ours = torch.from_dlpack(e.last_logits())[0].float().cpu()
        req.result()
    with torch.no_grad():
        ref = model.float()(torch.tensor([ids])).logits[0, -1]
    err = float((ours - ref).abs().max() / ref.abs().max())
    assert err < 0.05, err
    assert req.tokens[0] == int(ours.argmax())


def test_encoder_states_from_torch_on_the_device_and_the_host():
    torch = pytest.importorskip("torch")
    w = gd.Weights.synthetic(gd.ModelConfig.small_cross_test(), seed=5)
    cfg = w.config
    gen = torch.Generator().manual_seed(3)
    states = [torch.randn(n, cfg.hidden_size, generator=gen).to(torch.bfloat16)
              for n in (17, 1, 64, 300)]
    prompts = [[cfg.vocab_size] + prompt(9 + i, i) for i in range(len(states))]
    opts = dict(max_batch=8, max_context=128, max_encoder_len=320)

    def serve(to_states):  # the same batches in a fresh engine: bitwise the same work
        with gd.Engine(w, **opts) as e:
            reqs = [e.submit(p, max_new_tokens=12, encoder_states=to_states(s))
                    for p, s in zip(prompts, states)]
            reqs.append(e.submit(prompt(9), max_new_tokens=12))  # text only, same steps
            reqs.append(e.submit(prompt(9), max_new_tokens=12,
                                 encoder_states=to_states(states[0][:0])))  # 0 rows: text only
            e.run_until_idle()
            return [r.tokens for r in reqs]

    host = serve(lambda s: s)
    dev = serve(lambda s: s.cuda())
    assert host == dev and all(len(t) == 12 for t in host)
    assert host[-1] == host[-2]  # 0 rows of states = no states
    other = serve(lambda s: (-s).cuda())  # the states decide the tokens
    assert any(o != h for o, h in zip(other[:4], host[:4]))
    with gd.Engine(w, **opts) as e:
        with pytest.raises(gd.Error) as info:
            e.submit(prompts[0], encoder_states=states[0].float().cuda())
        assert info.value.field == "encoder_states"
        with pytest.raises(gd.Error) as info:
            e.submit(prompts[0], encoder_states=torch.zeros(400, cfg.hidden_size,
                                                            dtype=torch.bfloat16).cuda())
        assert info.value.field == "encoder.length"
        assert len(e.submit(prompts[1], max_new_tokens=3, encoder_states=states[1]).result()) == 3
        # Requests naming identical states share their text prefix's pages (prefix cache).
        long_prompt = [cfg.vocab_size] + prompt(47, 3)
        for expect_hit in (False, True):
            before = e.stats().prefix_hit_tokens
            r = e.submit(long_prompt, max_new_tokens=4, encoder_states=states[2].cuda(),
                         encoder_id=42)
            assert len(r.result()) == 4
            assert (e.stats().prefix_hit_tokens > before) == expect_hit
        with pytest.raises(gd.Error) as info:
            e.submit(prompts[0], encoder_states=states[0], encoder_id=-1)
        assert info.value.field == "encoder_id"
