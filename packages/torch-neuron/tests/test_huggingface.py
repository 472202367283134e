"""The Hugging Face training and inference libraries on the neuron device, each run against the same run on the
CPU (same tiny random model, data and seeds): Accelerate (the device chosen the way Accelerate picks a custom torch
device, ``ACCELERATE_TORCH_DEVICE``; bf16 mixed precision, gradient accumulation, clipping, save/load of the state),
PEFT (LoRA, DoRA, IA3, LoHa, OFT, prefix tuning on a tiny Llama: training, greedy generate, merge), TRL
(``SFTTrainer``), the Transformers ``Trainer`` (causal LM, BERT classification, T5 seq2seq, ViT), sampling
``generate``, Diffusers (tiny UNet2D DDPM/DDIM and DiT pipelines, UNet2D training). Everything is built offline
from tiny configs; the neuron runs are strict (no op may fall back to the CPU). A library that is not installed
skips its tests (``nox -s test`` installs them)."""

import contextlib
import os
import tempfile

import pytest
import torch
from torch_neuron_testing.native import native

FP32 = dict(rtol=1e-4, atol=1e-5)  # losses of float32 runs: only summation order differs
BF16 = dict(rtol=2e-2, atol=2e-2)  # bf16 autocast rounds every matmul input to 8 mantissa bits


# nothing here may come from the hub (huggingface_hub reads this when first imported; the tests build every
# model, tokenizer and dataset in memory, so it only guards against a library reaching out on its own)
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@contextlib.contextmanager
def accelerate_device(dev):
    """Accelerate's (and Trainer's) process state made afresh for ``dev``: ``ACCELERATE_TORCH_DEVICE`` is how
    Accelerate selects a torch device it has no detection of its own for; the neuron run is strict."""
    from accelerate.state import AcceleratorState, GradientState

    def reset():
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()

    old = os.environ.pop("ACCELERATE_TORCH_DEVICE", None)
    if dev == "neuron":
        os.environ["ACCELERATE_TORCH_DEVICE"] = "neuron"
    reset()
    try:
        with native() if dev == "neuron" else contextlib.nullcontext():
            yield
    finally:
        os.environ.pop("ACCELERATE_TORCH_DEVICE", None)
        if old is not None:
            os.environ["ACCELERATE_TORCH_DEVICE"] = old
        reset()


def tiny_llama(vocab=64, **kw):
    pytest.importorskip("transformers", reason="transformers is not installed")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **kw)
    return LlamaForCausalLM(cfg)


def token_rows(rows, cols, vocab=64):
    return torch.randint(0, vocab, (rows, cols), generator=torch.Generator().manual_seed(1))


# ---------------------------------------------------------------- Accelerate

def accelerate_loop(dev):
    """An MLP regression trained 2 epochs with bf16 autocast, accumulation over 2 batches and clipping; the
    state saved and loaded back. Returns the device, the dtype the first Linear computed in, and the losses."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    acc = Accelerator(mixed_precision="bf16", cpu=dev == "cpu", gradient_accumulation_steps=2)
    set_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 1))
    dtypes = []
    model[0].register_forward_hook(lambda mod, args, out: dtypes.append(out.dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(64, 16)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    model, opt, data = acc.prepare(model, opt, data)
    losses = []
    for _ in range(2):
        for xb, yb in data:
            with acc.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                acc.backward(loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad()
            losses.append(acc.gather(loss.detach()).item())
    with tempfile.TemporaryDirectory() as d:
        acc.save_state(d)
        acc.load_state(d)
    return next(model.parameters()).device, dtypes[0], losses


def test_accelerator_bf16_training_loop_matches_cpu():
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    with accelerate_device("cpu"):
        _, _, want = accelerate_loop("cpu")
    with accelerate_device("neuron"):
        device, dtype, got = accelerate_loop("neuron")
    assert device.type == "neuron" and dtype == torch.bfloat16
    torch.testing.assert_close(got, want, **BF16)
    assert sum(got[-4:]) < sum(got[:4])  # it learns


def test_accelerator_picks_neuron_from_accelerate_torch_device():
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    from accelerate import Accelerator, PartialState

    with accelerate_device("neuron"):
        acc = Accelerator()
        assert acc.device.type == "neuron" and PartialState().device.type == "neuron"
        assert acc.prepare(torch.nn.Linear(2, 2)).weight.device.type == "neuron"
        loader = acc.prepare(torch.utils.data.DataLoader(torch.arange(4.0), batch_size=2))
        assert [b.device.type for b in loader] == ["neuron", "neuron"]


# ---------------------------------------------------------------- PEFT

ADAPTERS = {  # name: (config class, kwargs); each adapter is trained, then merged where PEFT can merge it
    "lora": ("LoraConfig", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0)),
    "dora": ("LoraConfig", dict(r=4, target_modules=["q_proj", "v_proj"], use_dora=True, lora_dropout=0.0)),
    "ia3": ("IA3Config", dict(target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"])),
    "loha": ("LoHaConfig", dict(r=4, target_modules=["q_proj", "v_proj"])),
    "oft": ("OFTConfig", dict(r=0, oft_block_size=8, target_modules=["q_proj", "v_proj"])),
    "prefix_tuning": ("PrefixTuningConfig", dict(task_type="CAUSAL_LM", num_virtual_tokens=4)),
}


def adapter_losses(dev, name, steps=4):
    """Training losses of the adapter, then the loss of the merged model (if mergeable) and greedy tokens."""
    import peft

    config, kwargs = ADAPTERS[name]
    model = peft.get_peft_model(tiny_llama(), getattr(peft, config)(**kwargs)).to(dev)
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = {n: p.detach().cpu().clone() for n, p in model.named_parameters() if not p.requires_grad}
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    ids = token_rows(2, 16).to(dev)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert all(torch.equal(p.detach().cpu(), frozen[n]) for n, p in model.named_parameters() if not p.requires_grad)
    tokens = model.generate(input_ids=ids[:1, :4], max_new_tokens=4, do_sample=False).cpu()
    if name != "prefix_tuning":
        losses.append(model.merge_and_unload()(input_ids=ids, labels=ids).loss.item())
    return losses, tokens


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_peft_adapter_fine_tuning_matches_cpu(name):
    pytest.importorskip("peft", reason="peft is not installed")
    want, want_tokens = adapter_losses("cpu", name)
    with native("mm"):
        got, tokens = adapter_losses("neuron", name)
    torch.testing.assert_close(got, want, **FP32)
    assert torch.equal(tokens, want_tokens)
    assert got[3] < got[0]


# ---------------------------------------------------------------- TRL

def word_tokenizer():
    """A word-level fast tokenizer made in memory (no hub download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = "the a cat dog sat on mat ran to park big small red blue".split()
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def sft_run(dev, bf16=False):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok = word_tokenizer()
    model = tiny_llama(len(tok), pad_token_id=0, bos_token_id=1, eos_token_id=2)
    texts = ["the cat sat on the mat", "a dog ran to the park", "the big red cat", "a small blue dog sat"] * 4
    with tempfile.TemporaryDirectory() as d:
        # bf16=False by default: SFTConfig's own default is bf16 (test_huggingface_detection runs that)
        args = SFTConfig(output_dir=d, max_steps=5, per_device_train_batch_size=4, learning_rate=1e-2, logging_steps=1,
                         report_to=[], save_strategy="no", use_cpu=dev == "cpu", seed=0, max_length=16,
                         disable_tqdm=True, bf16=bf16)
        trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"text": texts}),
                             processing_class=tok)
        trainer.train()
    return trainer.model.device, [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_trl_sft_trainer_matches_cpu():
    pytest.importorskip("trl", reason="trl is not installed")
    pytest.importorskip("datasets", reason="datasets is not installed")
    with accelerate_device("cpu"):
        _, want = sft_run("cpu")
    with accelerate_device("neuron"):
        device, got = sft_run("neuron")
    assert device.type == "neuron" and len(got) == 5
    torch.testing.assert_close(got, want, **FP32)
    assert got[-1] < got[0]


# ---------------------------------------------------------------- Transformers Trainer

def trainer_task(name):
    """A tiny model of a task family and 16 examples for it: causal LM, sequence classification, seq2seq, vision."""
    import transformers as T

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 64, (16, 12), generator=g)
    if name == "llama":
        return tiny_llama(), [{"input_ids": r, "labels": r} for r in ids]
    if name == "bert":
        cfg = T.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, hidden_dropout_prob=0, attention_probs_dropout_prob=0, num_labels=3)
        return T.BertForSequenceClassification(cfg), [{"input_ids": r, "labels": i % 3} for i, r in enumerate(ids)]
    if name == "t5":
        cfg = T.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0,
                         decoder_start_token_id=0)
        return T.T5ForConditionalGeneration(cfg), [{"input_ids": r, "labels": r[:6]} for r in ids]
    cfg = T.ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, num_labels=3, hidden_dropout_prob=0, attention_probs_dropout_prob=0)
    images = torch.randn(16, 3, 16, 16, generator=g)
    return T.ViTForImageClassification(cfg), [{"pixel_values": x, "labels": i % 3} for i, x in enumerate(images)]


def trainer_run(dev, name):
    """4 training steps and an evaluation; the device the parameters were on at each step end."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    devices = set()

    class WhereParametersAre(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            devices.add(next(model.parameters()).device.type)

    model, data = trainer_task(name)
    with tempfile.TemporaryDirectory() as d:
        args = TrainingArguments(output_dir=d, max_steps=4, per_device_train_batch_size=4, learning_rate=5e-3,
                                 logging_steps=1, report_to=[], save_strategy="no", use_cpu=dev == "cpu", seed=0,
                                 disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:8],
                          callbacks=[WhereParametersAre()])
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        losses.append(trainer.evaluate()["eval_loss"])
    return args.device, devices, losses


@pytest.mark.parametrize("name", ["llama", "bert", "t5", "vit"])
def test_transformers_trainer_trains_on_neuron_and_matches_cpu(name):
    pytest.importorskip("accelerate", reason="accelerate is not installed")  # Trainer requires it
    pytest.importorskip("transformers", reason="transformers is not installed")
    with accelerate_device("cpu"):
        _, _, want = trainer_run("cpu", name)
    before = torch.neuron.metrics()["native"].get("mm", 0)
    with accelerate_device("neuron"):
        device, devices, got = trainer_run("neuron", name)
    assert device.type == "neuron" and devices == {"neuron"}
    assert torch.neuron.metrics()["native"].get("mm", 0) > before  # the matmuls ran on the device
    torch.testing.assert_close(got, want, **FP32)


def test_sampling_generate_draws_on_neuron_among_the_cpu_top_k():
    """``generate(do_sample=True, top_k=3)`` samples on the device (multinomial included); every drawn token is
    one of the 3 most likely under the CPU model given the sequence so far (streams differ from the CPU's, so
    the tokens themselves cannot be compared)."""
    model = tiny_llama(eos_token_id=None, pad_token_id=0).eval()  # no end of sequence: every row draws 6 tokens
    prompt = token_rows(3, 4)
    with native("multinomial"), torch.no_grad():
        seqs = model.to("neuron").generate(input_ids=prompt.to("neuron"), attention_mask=torch.ones_like(
            prompt, device="neuron"), max_new_tokens=6, do_sample=True, top_k=3).cpu()
    with torch.no_grad():
        logits = model.cpu()(seqs).logits[:, 3:-1]
    drawn = seqs[:, 4:]
    assert drawn.shape == (3, 6)
    assert (logits.topk(3, -1).indices == drawn.unsqueeze(-1)).any(-1).all()


# ---------------------------------------------------------------- Diffusers

def tiny_unet():
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    return UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
                       down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=4, attention_head_dim=8).eval()


def tiny_dit_parts():
    from diffusers import AutoencoderKL, DiTTransformer2DModel

    torch.manual_seed(0)
    # 1000 classes: DiTPipeline's classifier-free guidance uses class 1000 as the null class
    transformer = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8,
                                        num_layers=2, sample_size=4, patch_size=2, num_embeds_ada_norm=1000)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), latent_channels=4,
                        norm_num_groups=4, layers_per_block=1, sample_size=8)
    return {"transformer": transformer.eval(), "vae": vae.eval()}


def pipeline_images(pipe, dev, **kw):
    pipe = pipe.to(dev)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(generator=torch.Generator("cpu").manual_seed(0), num_inference_steps=4, output_type="pt", **kw)
    return out.images.cpu()


PIPELINES = {  # name: (pipeline class, scheduler class, parts factory, call kwargs)
    "ddpm_unet2d": ("DDPMPipeline", "DDPMScheduler", lambda: {"unet": tiny_unet()}, {"batch_size": 2}),
    "ddim_unet2d": ("DDIMPipeline", "DDIMScheduler", lambda: {"unet": tiny_unet()}, {"batch_size": 2}),
    "dit_ddim": ("DiTPipeline", "DDIMScheduler", tiny_dit_parts, {"class_labels": [1, 3], "guidance_scale": 2.0}),
}


@pytest.mark.parametrize("name", list(PIPELINES))
def test_diffusers_pipeline_inference_matches_cpu(name):
    diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
    pipeline, scheduler, parts, kw = PIPELINES[name]
    pipe = getattr(diffusers, pipeline)(**parts(), scheduler=getattr(diffusers, scheduler)(num_train_timesteps=20))
    want = pipeline_images(pipe, "cpu", **kw)
    with native("convolution"):  # the VAE decoder of DiT convolves too
        got = pipeline_images(pipe, "neuron", **kw)
    assert want.std() > 0.05  # an image, not a constant
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def unet_training_losses(dev, steps=3):
    """A few denoising steps of training (DDPM noise prediction) of the tiny UNet2D: convolutions, group norm,
    attention and the upsampling's backward."""
    from diffusers import DDPMScheduler

    unet = tiny_unet().train().to(dev)
    scheduler = DDPMScheduler(num_train_timesteps=50)
    opt = torch.optim.AdamW(unet.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        clean, noise = torch.randn(4, 3, 8, 8, generator=g), torch.randn(4, 3, 8, 8, generator=g)
        t = torch.randint(0, 50, (4,), generator=g)
        noisy = scheduler.add_noise(clean, noise, t)
        loss = torch.nn.functional.mse_loss(unet(noisy.to(dev), t.to(dev)).sample, noise.to(dev))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_diffusers_unet_training_matches_cpu():
    pytest.importorskip("diffusers", reason="diffusers is not installed")
    want = unet_training_losses("cpu")
    with native("convolution", "upsample_nearest2d_backward"):
        got = unet_training_losses("neuron")
    torch.testing.assert_close(got, want, **FP32)
