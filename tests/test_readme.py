"""README's first screen is a new user's path: the two commands, what the project is, how to install it
into an existing environment, a PyTorch and an MXNet example, and the contract."""
import ast
import re
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _user_path() -> str:
    """What stands between the two commands' block and the results."""
    start = README.index("scripts/test.sh")
    return README[start:README.index("## Results")]


def test_readme_opens_with_the_two_commands():
    first_block = README.split("```")[1]
    assert "scripts/demo.sh" in first_block and "scripts/test.sh" in first_block


def test_the_user_path_comes_right_after_the_two_commands():
    path = _user_path()
    assert "build_byteps.sh" in path and "pip install" in path  # into the user's own environment
    blocks = re.findall(r"```python\n(.*?)```", path, re.S)
    assert len(blocks) == 2, "one PyTorch and one MXNet example"
    torch_example, mxnet_example = blocks
    assert "byteps.torch" in torch_example and "DistributedOptimizer" in torch_example
    assert "byteps.mxnet" in mxnet_example and "DistributedTrainer" in mxnet_example
    for block in blocks:
        ast.parse(block)  # the examples are Python as written
        assert len(block.strip().splitlines()) <= 6
    # the contract: what differs from stock BytePS, and the one setting that changes step()'s semantics
    assert "The contract" in path and "BYTEPS_PROPHET_OVERLAP" in path and "DistributedDataParallel" in path
