/* The dashboard (see index.html). */
