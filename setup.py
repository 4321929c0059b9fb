"""Packaging for grpo_zoo.

The top-level algorithms/, samplers/ and configs/ folders install as grpo_zoo.algorithms,
grpo_zoo.samplers and grpo_zoo.configs (package_dir); an editable install keeps that working.
"""

from setuptools import find_packages, setup

PLUGIN_DIRS = {"grpo_zoo.algorithms": "algorithms", "grpo_zoo.samplers": "samplers", "grpo_zoo.configs": "configs"}

setup(
    name="grpo_zoo",
    version="0.1.0",
    description="GRPO-family RL for (multimodal) language models: DIVA-GRPO and its baselines on one engine",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=[*find_packages(include=["grpo_zoo", "grpo_zoo.*"]), *PLUGIN_DIRS],
    package_dir={"grpo_zoo": "grpo_zoo", **PLUGIN_DIRS},
    package_data={"grpo_zoo.configs": ["*.yaml", "*/*.yaml", "*/*/*.yaml"], "grpo_zoo.augment": ["templates/*.txt"]},
    install_requires=[
        # torch is pinned by the install commands (the CPU build); any 2.x works here.
        "torch>=2.4",
        "transformers>=4.57",
        "datasets>=3.0",
        "numpy>=1.26",
        "scipy>=1.11",
        "pillow>=10.0",
        "tensorboard>=2.15",
        "pyyaml>=6.0",
        "math-verify>=0.7",
        "tqdm>=4.66",
        "matplotlib>=3.8",
        "safetensors>=0.4",
        "peft>=0.13",
    ],
    extras_require={
        "ray": ["ray[default]>=2.40"],
        "deepspeed": ["deepspeed>=0.19.8"],
        "vllm": ["vllm>=0.10.2"],  # GPU only; imported lazily
        # ray and deepspeed so the test suite exercises both backends (on CPU: local Ray, gloo)
        "test": ["pytest>=8", "hypothesis>=6.100", "ruff>=0.6", "pytest-timeout>=2.3", "ray>=2.40",
                 "deepspeed>=0.19.8"],
    },
    entry_points={"console_scripts": ["grpo-zoo = grpo_zoo.cli:main"]},
    classifiers=["Programming Language :: Python :: 3", "Topic :: Scientific/Engineering :: Artificial Intelligence"],
)
