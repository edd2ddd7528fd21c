"""Fast paths of Neural Laplace training: the same maths as :mod:`nlmodels.neural_laplace`,
restructured for speed, and held to it by the tests.

* :func:`gru_final_output`: the encoder GRU's last output. On CUDA, ``nn.GRU`` (cuDNN); on the
  CPU a GRU with hand-written backpropagation through time: the native kernels' whole recurrence
  (:mod:`nlmodels.accel.gru`, ``_NativeGRU``) or the torch wavefront (``_WavefrontGRU``).
* :func:`fused_sphere_decode`: g's last two layers, the Riemann-sphere output map and a linear
  ILT fused into one autograd function (:mod:`nlmodels.accel.decoder`), its elementwise steps
  in the native kernels or their torch twin.
* :func:`select`: the one choice: the native kernels, their torch twins, or (under
  ``torch.compile``, ``torch.func.vmap`` or :func:`plain_formulas`) the model's plain formulas.
* :mod:`nlmodels.accel.native`: the C kernels, their build, verified cache and checked calls.
"""

from nlmodels.accel._select import Backend, plain_formulas, select
from nlmodels.accel.decoder import fused_sphere_decode
from nlmodels.accel.gru import gru_final_output

__all__ = ["Backend", "fused_sphere_decode", "gru_final_output", "plain_formulas", "select"]
