# mf_load.py: what only loading a Session needs besides mf_session's _load: the model's input
# for one example (model_input), the CSV reader of the data files (read) and the train/test split
# (split_idx). Imported by Session() and dropped with the other modules only loading needs
# (mf_session.LOAD_ONLY, on MicroPython): its code's heap goes back to the data and the fit. Each
# method of Load takes the session as its first argument; Load is never made.
from microformer.finite import NonFiniteError
from microformer.tensor import Rng


class Load:
    """The session's load-only methods (mf_session's _load calls them as Load.read(s, path))."""

    def model_input(self, where):
        # the model's input for one example: [L, C] for a window, unless the model takes the
        # L*C numbers flat (a spec starting with Reshape); its output must be one score per
        # class / target. Returns (shape, memory need for a batch).
        shape = tuple(self.input_shape)
        tries = [shape]
        if len(shape) == 2:
            tries.append((self.num_features,))
        why = []
        for s in tries:
            try:
                need = self.model.summary((self.batch_size,) + s, show=False)
                out = self.model.output_shape((1,) + s)
            except (ValueError, IndexError, TypeError) as e:
                why.append("[B, %s]: %s" % (", ".join(str(d) for d in s), e))
                continue
            n_out = len(self.outputs)
            if len(out) != 2 or out[1] != n_out:
                raise ValueError("Session: %s: the model gives %s per example, but its metadata "
                                 "names %d %s (%s): expected [1, %d]"
                                 % (where, list(out), n_out, "classes" if self.task == "classify" else "targets",
                                    ", ".join(self.outputs), n_out))
            return s, need
        raise ValueError("Session: %s: the model does not take the metadata's input_shape %s (%s)"
                         % (where, self.input_shape, "; ".join(why)))

    def read(self, path):
        # microformer.data's CSV reader; its error (file, line, column, value) says how to go on.
        # A regression row: the example's numbers, then one number per target (the last one is
        # the reader's 'label' field). Returns the file's form (as mf_examples keeps it): X flat
        # with the columns before the last field, y indices into _file_labels().
        self._reading = path
        from microformer.csvfile import read_rows       # LOAD_ONLY: the files are read while loading
        try:
            X, y, labels, _ = read_rows(path, self.classes or None, None, len(self._file_columns()),
                                        "Session")
        except ValueError as e:
            raise (NonFiniteError if isinstance(e, NonFiniteError) else ValueError)(
                "%s. Fix or delete that line (from the host: mpremote edit :%s), then start a new "
                "Session" % (e, path))
        self._reading = self.checkpoint_path
        if self.task == "classify":
            return X, y
        for s in labels:
            try:
                v = float(s)
            except ValueError:
                v = None
            if v is None or v - v != 0.0:
                raise ValueError("Session: %s: the target %s (the last field) must be a finite number, "
                                 "got %r. Fix or delete that line (from the host: mpremote edit :%s), "
                                 "then start a new Session" % (path, self.targets[-1], s, path))
            if s not in self._labels:
                self._labels.append(s)
        return X, [self._labels.index(labels[k]) for k in y]

    def split_idx(self, _meta):
        # (train rows, test rows) of the base data, from microformer.meta (module `_meta`)
        n = len(self._base[1])
        given = _meta.split_rows(self._m, n)       # the model's own split: never reshuffled
        if given is not None:
            return given
        idx = Rng(self._m["split_seed"]).shuffle(list(range(n)))
        k = _meta.n_train(self._m, n)
        return idx[:k], idx[k:]
