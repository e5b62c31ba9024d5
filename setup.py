"""byteps-prophet: predictable communication scheduling for BytePS (Prophet, ByteScheduler, FIFO)."""
from setuptools import find_packages, setup

setup(
    name="byteps-prophet",
    version="0.1.0",
    description="Prophet and ByteScheduler communication scheduling for BytePS, PyTorch and MXNet",
    packages=find_packages(include=["byteps_prophet", "byteps_prophet.*"]),
    package_data={"byteps_prophet.cluster": ["gloo-compose.yml"]},
    python_requires=">=3.11,<3.12",
    install_requires=[
        "numpy<1.24",
        "PyYAML>=6",
        "tqdm>=4.60",
        "matplotlib>=3.7",
        "bayesian-optimization>=1.4,<2",
    ],
    extras_require={
        # Pinned exactly: any other torch pulls a multi-GB CUDA build.
        "torch": ["torch==2.13.0"],
        "mxnet": ["mxnet==1.9.1"],
        "test": ["pytest>=8", "pytest-timeout>=2", "hypothesis>=6"],
    },
    entry_points={"console_scripts": ["byteps-prophet=byteps_prophet.cli:main"]},
)
