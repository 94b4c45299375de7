"""Shared helpers for the tests that build DVM graphs by hand (fusion, partition): a float32 input
node and an elementwise node."""
from dvm.graph import build
from dvm.graph.dtypes import DType
from dvm.graph.node import Node


def f32_input(shape, index):
    return Node.make("input", DType.FLOAT32, shape, index=index)


def ew(ctx, name, *args):
    return build.elementwise(ctx, name, *args)
