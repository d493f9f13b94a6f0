package redisqueue_test

const childEnv = "REDISQUEUE_TEST_CHILD"

func childMain() int { return 0 }
