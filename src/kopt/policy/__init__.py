"""The rules over what the store holds: which candidate ranks first, which iteration improved, which
candidate the views show. They read through kopt.store and write nothing.

- `ranking`    : candidates ranked over the ledger; the raw-row helpers (candidate id, speedup, geomeans).
- `iterations` : the committed iterations judged by the improvement rule; the trajectory the views draw.
- `shown`      : which candidate the report, the plots, `kopt status` and `kopt candidates` show.
"""
