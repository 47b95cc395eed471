"""asv benchmarks: one training step's embedding part, embedding_bag_backward_update, beside
PyTorch (nn.EmbeddingBag(sparse=True) backward + torch.optim.Adagrad / SparseAdam step) and,
where it imports, FBGEMM's CPU SplitTableBatchedEmbeddingBagsCodegen with EXACT_ROWWISE_ADAGRAD.

The ISA level comes from PERFKERNELS_ISA (asv.conf.json's matrix); inputs are seeded and built by
perfkernels.families.training.bench.  Each benchmark updates its own copy of the table in place.
"""
from .common import isa_or_skip, torch_or_skip


class TrainingStep:
    # (rows, D, bags, bag length): the DLRM table, and a small one
    params = ([(1_000_000, 64, 2048, 100), (100_000, 64, 256, 40)],)
    param_names = ["shape"]
    timeout = 600

    def setup(self, shape):
        from perfkernels.families.training.bench import make_inputs, step_functions
        self.x = make_inputs(7, *shape)
        self.step_functions = step_functions

    which = ("ours",)

    def _fns(self):
        if not hasattr(self, "fns"):
            self.fns = self.step_functions(self.x, torch_threads=1, num_threads=1,
                                           which=self.which)
        return self.fns


class TrainingStepOurs(TrainingStep):
    def setup(self, shape):
        isa_or_skip()
        super().setup(shape)

    def time_adagrad(self, shape):
        self._fns()["ours:adagrad"]()

    def time_rowwise_adagrad(self, shape):
        self._fns()["ours:rowwise_adagrad"]()

    def time_adam(self, shape):
        self._fns()["ours:adam"]()

    def time_rowwise_adam(self, shape):
        self._fns()["ours:rowwise_adam"]()


class TrainingStepTorch(TrainingStep):
    which = ("torch",)

    def setup(self, shape):
        torch_or_skip()
        super().setup(shape)
        if "torch" not in self._fns():
            raise NotImplementedError("PyTorch is not installed")

    def time_torch_adagrad(self, shape):
        self.fns["torch"]()

    def time_torch_sparse_adam(self, shape):
        self.fns["torch:sparse_adam"]()


class TrainingStepFbgemm(TrainingStep):
    which = ("fbgemm",)

    def setup(self, shape):
        torch_or_skip()
        from perfkernels.families.training.bench import fbgemm_or_none
        if fbgemm_or_none() is None:
            raise NotImplementedError("fbgemm_gpu (pip install fbgemm-gpu-cpu==1.8.0) does not import")
        super().setup(shape)
        self._fns()

    def time_fbgemm_rowwise_adagrad(self, shape):
        self.fns["fbgemm"]()
