package main

// costs is how many SQL statements each call of the raw loop runs, read off the dialect's
// code: the raw loop counts its calls and their results, and multiplies. A statement is
// one the server executes: BEGIN, SET TRANSACTION, COMMIT and ROLLBACK count; a protocol
// step (pgx's Parse/Describe on a connection's first use of a text, database/sql's
// PREPARE and CLOSE around a MySQL statement run as text with arguments) does not.
//
// PostgreSQL's counts are also measured at the driver (a pgx tracer) and the harness
// warns when the two disagree. The batched settlement (SettleLeases) is one statement on
// PostgreSQL and SQLite; on MySQL a READ COMMITTED transaction (SET TRANSACTION, START
// TRANSACTION), a SELECT … FOR UPDATE, the DELETE and the COMMIT.
type costs struct {
	claimLease, claimLeaseEmpty   int // ClaimLeases that returned a row / none
	settleLease                   int // SettleLease
	settleBatch                   int // SettleLeases (the batched raw loop)
	claimLocked, claimLockedEmpty int // ClaimLocked that returned a claim / none
	settleLocked                  int // LockedClaim.Settle(ack)
	candidates                    int // Candidates
	tryLock                       int // Session.TryLock (Session itself runs none)
	take, takeMissed              int // Session.Take that took the row / found it gone
	settleSession                 int // Session.Settle(ack)
	unlockHeld, unlockNotHeld     int // Session.Unlock holding a key / holding none
}

var (
	// SQLite: every claim and settlement is one autocommit statement (the lease claim an
	// UPDATE … RETURNING; the advisory take an UPDATE … RETURNING, the table having an
	// attempt column). Keys live in the process's registry: TryLock and Unlock run none.
	sqliteCosts = costs{
		claimLease: 1, claimLeaseEmpty: 1, settleLease: 1, settleBatch: 1,
		candidates: 1, tryLock: 0, take: 1, takeMissed: 1, settleSession: 1, unlockHeld: 0, unlockNotHeld: 0,
	}
	// PostgreSQL: the lease claim is one statement (a CTE that locks, stamps and
	// counts); the row lock claim is BEGIN + SELECT … FOR UPDATE SKIP LOCKED, and its
	// settlement DELETE + COMMIT (BEGIN, SELECT, ROLLBACK when no row is due); the
	// advisory session runs pg_try_advisory_lock, the take (UPDATE … RETURNING), the
	// DELETE and pg_advisory_unlock, one statement each.
	postgresCosts = costs{
		claimLease: 1, claimLeaseEmpty: 1, settleLease: 1, settleBatch: 1,
		claimLocked: 2, claimLockedEmpty: 3, settleLocked: 2,
		candidates: 1, tryLock: 1, take: 1, takeMissed: 1, settleSession: 1, unlockHeld: 1, unlockNotHeld: 0,
	}
	// MySQL/MariaDB: a claim transaction opens with SET TRANSACTION ISOLATION LEVEL READ
	// COMMITTED + START TRANSACTION (database/sql's BeginTx with a level). The lease claim
	// is that, SELECT … FOR UPDATE SKIP LOCKED, UPDATE (stamp the leases), COMMIT (no
	// UPDATE and a ROLLBACK when nothing is due); its ack one DELETE. The row lock claim is
	// the opening and the SELECT; its settlement DELETE + COMMIT. The advisory session runs
	// GET_LOCK, the take as an UPDATE (count the attempt) and a SELECT (read the row; not
	// run when the UPDATE matched nothing), the DELETE and RELEASE_LOCK. Claims retried
	// after a deadlock would run more; the loop cannot see those.
	mysqlCosts = costs{
		claimLease: 5, claimLeaseEmpty: 4, settleLease: 1, settleBatch: 5,
		claimLocked: 3, claimLockedEmpty: 4, settleLocked: 2,
		candidates: 1, tryLock: 1, take: 2, takeMissed: 1, settleSession: 1, unlockHeld: 1, unlockNotHeld: 0,
	}
)
