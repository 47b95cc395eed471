# Shared aliases for the stubs of the compiled modules.
from typing import Literal, Union

import numpy as np
import numpy.typing as npt

Float32Array = npt.NDArray[np.float32]
IndexArray = Union[npt.NDArray[np.int32], npt.NDArray[np.int64]]
TableArray = npt.NDArray[np.generic]   # float32, float16 or ml_dtypes.bfloat16
Mode = Literal["sum", "mean"]
GateOrder = Literal["ifog", "ifgo"]
