"""Operations over checkpoints of any format: pure functions returning reports, no printing."""
