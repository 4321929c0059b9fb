"""Load Qwen2-VL / Qwen2.5-VL processors without torchvision (imported for its side effect).

transformers 5 builds Qwen2(.5)-VL processors with three parts: image processor, tokenizer and
a video processor. The video processor needs torchvision, so without it
`Qwen2_5_VLProcessor(...)` cannot be constructed at all, and `AutoProcessor.from_pretrained`
either fails or silently falls back to a bare tokenizer (no images, no error). grpo_zoo never
feeds video, so on import this module:

1. defines image-only subclasses (same class names, so saved directories stay standard Qwen
   checkpoints that any other tool loads);
2. registers them with `AutoProcessor` for the Qwen2-VL / Qwen2.5-VL configs;
3. when torchvision is missing, makes transformers resolve the class *names* written in
   `preprocessor_config.json` / `processor_config.json` ("Qwen2_5_VLProcessor") to these
   subclasses, so `AutoProcessor.from_pretrained(path)` gives the full image processor +
   tokenizer processor for a user's real checkpoint too.

With torchvision installed, step 3 is skipped and the library's own classes are used.
Every step is idempotent (importing twice, or reloading this module, changes nothing).
"""

from __future__ import annotations

import importlib
from typing import Any

from transformers import AutoProcessor, ProcessorMixin
from transformers.models.qwen2_5_vl import Qwen2_5_VLConfig
from transformers.models.qwen2_5_vl import processing_qwen2_5_vl as _q25
from transformers.models.qwen2_vl import Qwen2VLConfig
from transformers.models.qwen2_vl import processing_qwen2_vl as _q2
from transformers.utils import is_torchvision_available

_IMAGE_TOKEN = "<|image_pad|>"
_VIDEO_TOKEN = "<|video_pad|>"


def _init_image_only(self: Any, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None,
                     **kwargs: Any) -> None:
    """The library __init__ minus the video processor; token ids looked up the same way."""
    if tokenizer is None:
        raise ValueError(f"{type(self).__name__} needs a tokenizer (got None)")
    self.image_token = getattr(tokenizer, "image_token", None) or _IMAGE_TOKEN
    self.video_token = getattr(tokenizer, "video_token", None) or _VIDEO_TOKEN
    self.image_token_id = getattr(tokenizer, "image_token_id", None) or tokenizer.convert_tokens_to_ids(
        self.image_token
    )
    # Kept for code that reads it (and the model config's video_token_id); never used to expand video.
    self.video_token_id = getattr(tokenizer, "video_token_id", None) or tokenizer.convert_tokens_to_ids(
        self.video_token
    )
    if self.image_token_id is None or self.image_token_id == getattr(tokenizer, "unk_token_id", -1):
        raise ValueError(f"tokenizer has no '{self.image_token}' token; a Qwen-VL tokenizer must define it")
    ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)


def _make_image_only(base: type) -> type:
    """An image-only subclass of a Qwen-VL processor class, under the same class name."""
    # `get_attributes` reads the __init__ signature: without a video_processor parameter the
    # mixin neither loads nor saves one.
    def __init__(self: Any, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None,
                 **kwargs: Any) -> None:
        _init_image_only(self, image_processor, tokenizer, chat_template, **kwargs)

    cls = type(
        base.__name__,
        (base,),
        {
            "__init__": __init__,
            "__module__": __name__,
            "__doc__": f"{base.__name__} without the video processor (no torchvision needed).",
            "_grpo_zoo_image_only": True,
        },
    )
    return cls


def _original(module: Any, name: str) -> type:
    """The library class even if this module was imported before (idempotence)."""
    cls = getattr(module, name)
    while getattr(cls, "_grpo_zoo_image_only", False):
        cls = cls.__mro__[1]
    return cls


Qwen2_5_VLProcessor = _make_image_only(_original(_q25, "Qwen2_5_VLProcessor"))
Qwen2VLProcessor = _make_image_only(_original(_q2, "Qwen2VLProcessor"))

IMAGE_ONLY_PROCESSORS: dict[type, type] = {Qwen2_5_VLConfig: Qwen2_5_VLProcessor, Qwen2VLConfig: Qwen2VLProcessor}


def _install() -> None:
    for config_cls, proc_cls in IMAGE_ONLY_PROCESSORS.items():
        AutoProcessor.register(config_cls, proc_cls, exist_ok=True)
    if is_torchvision_available():
        return
    # transformers resolves a saved `processor_class` name by importing the model's package and
    # reading the attribute of that name; pointing it (and the processing module) at the
    # image-only class is what makes plain AutoProcessor work on real checkpoints.
    for package, module, proc_cls in (
        ("transformers.models.qwen2_5_vl", _q25, Qwen2_5_VLProcessor),
        ("transformers.models.qwen2_vl", _q2, Qwen2VLProcessor),
    ):
        setattr(importlib.import_module(package), proc_cls.__name__, proc_cls)
        setattr(module, proc_cls.__name__, proc_cls)


_install()


def is_image_only(processor: Any) -> bool:
    """True for a processor built by this module."""
    return bool(getattr(type(processor), "_grpo_zoo_image_only", False))


def load_processor(path: str) -> Any:
    """AutoProcessor.from_pretrained(path), local files only, refusing the silent bare-tokenizer fallback.

    Raises:
        ValueError: the directory declares a vision model (config has `vision_config`) but the
            processor that came back has no image processor.
    """
    import json
    from pathlib import Path

    try:
        processor = AutoProcessor.from_pretrained(path, local_files_only=True)
    except OSError as error:
        image_only = _image_only_class(path)
        if image_only is None or "video processor" not in str(error):
            raise
        # With torchvision installed transformers builds its own class, which wants a video
        # processor config that image-only directories (the testbed's, ours saved) never had.
        processor = image_only.from_pretrained(path, local_files_only=True)
    config_file = Path(path) / "config.json"
    is_vision = config_file.is_file() and "vision_config" in json.loads(config_file.read_text())
    if is_vision and getattr(processor, "image_processor", None) is None:
        raise ValueError(
            f"{path}: a vision-language model, but AutoProcessor returned {type(processor).__name__} "
            "without an image processor; check preprocessor_config.json / processor_config.json"
        )
    return processor


def _image_only_class(path: str) -> type | None:
    """The image-only processor class for the Qwen-VL model in `path`, or None for any other model."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        return None
    return IMAGE_ONLY_PROCESSORS.get(type(config))
