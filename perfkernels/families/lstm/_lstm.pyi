from ._typing import Float32Array, GateOrder, IndexArray

def lstm_unit(h_prev: Float32Array, c_prev: Float32Array, gates: Float32Array, *,
              seq_lengths: IndexArray | None = None, t: int = 0, forget_bias: float = 0.0,
              drop_states: bool = False, gate_order: GateOrder = "ifog",
              out: tuple[Float32Array | None, Float32Array | None] | None = None,
              num_threads: int | None = None) -> tuple[Float32Array, Float32Array]: ...
def lstm_unit_backward(c_prev: Float32Array, gates: Float32Array, c: Float32Array,
                       dh: Float32Array, dc: Float32Array, *,
                       seq_lengths: IndexArray | None = None, t: int = 0,
                       forget_bias: float = 0.0, drop_states: bool = False,
                       gate_order: GateOrder = "ifog",
                       out: tuple[Float32Array | None, Float32Array | None, Float32Array | None] | None = None,
                       num_threads: int | None = None) -> tuple[Float32Array, Float32Array, Float32Array]: ...
