/*
** test_list.c: the intrusive list (ums-list.h): order kept by every push
** and insertion, removal from the front, the middle and the back, both
** ends kept right when the list empties, and an element found again from
** its link.
*/
#include "ums-list.h"
#include "test-util.h"

typedef struct item {
  int value;
  ums_link_t link;
} item_t;

#define ITEM(l) UMS_LIST_ENTRY(l, item_t, link)

/* Checks that l holds exactly want[0..n-1], walking both ways. */
static void check_order(const ums_list_t *l, const int *want, int n) {
  int i = 0;
  for (item_t *it = ITEM(l->head); it; it = ITEM(it->link.next)) {
    CHECK_LT(i, n);
    CHECK_EQ(it->value, want[i]);
    i++;
  }
  CHECK_EQ(i, n);
  for (item_t *it = ITEM(l->tail); it; it = ITEM(it->link.prev)) {
    i--;
    CHECK_GE(i, 0);
    CHECK_EQ(it->value, want[i]);
  }
  CHECK_EQ(i, 0);
  CHECK(ums_list_empty(l) == (n == 0));
}

static void test_push_and_pop(void) {
  item_t v[4] = {{1, {0}}, {2, {0}}, {3, {0}}, {4, {0}}};
  ums_list_t l;
  ums_list_init(&l);
  check_order(&l, NULL, 0);
  CHECK(ums_list_pop_front(&l) == NULL);
  ums_list_push_back(&l, &v[1].link);
  ums_list_push_back(&l, &v[2].link);
  ums_list_push_front(&l, &v[0].link);
  ums_list_push_back(&l, &v[3].link);
  check_order(&l, (int[]){1, 2, 3, 4}, 4);
  for (int k = 1; k <= 4; k++) {
    ums_link_t *e = ums_list_pop_front(&l);
    CHECK(e != NULL);
    CHECK_EQ(ITEM(e)->value, k);
    CHECK(e->prev == NULL && e->next == NULL);
  }
  check_order(&l, NULL, 0);
  CHECK(l.tail == NULL);
}

static void test_remove_anywhere(void) {
  item_t v[5];
  ums_list_t l;
  ums_list_init(&l);
  for (int k = 0; k < 5; k++) {
    v[k].value = k;
    ums_list_push_back(&l, &v[k].link);
  }
  ums_list_remove(&l, &v[2].link);  /* the middle */
  CHECK(v[2].link.prev == NULL && v[2].link.next == NULL);
  check_order(&l, (int[]){0, 1, 3, 4}, 4);
  ums_list_remove(&l, &v[4].link);  /* the back */
  check_order(&l, (int[]){0, 1, 3}, 3);
  ums_list_remove(&l, &v[0].link);  /* the front */
  check_order(&l, (int[]){1, 3}, 2);
  ums_list_remove(&l, &v[3].link);
  ums_list_remove(&l, &v[1].link);  /* the last one left */
  check_order(&l, NULL, 0);
  CHECK(l.head == NULL && l.tail == NULL);
  /* An element removed can be pushed again. */
  ums_list_push_back(&l, &v[2].link);
  check_order(&l, (int[]){2}, 1);
}

static void test_insert_after(void) {
  item_t v[4] = {{10, {0}}, {20, {0}}, {30, {0}}, {40, {0}}};
  ums_list_t l;
  ums_list_init(&l);
  ums_list_push_back(&l, &v[0].link);
  ums_list_insert_after(&l, &v[0].link, &v[2].link);  /* after the tail */
  check_order(&l, (int[]){10, 30}, 2);
  ums_list_insert_after(&l, &v[0].link, &v[1].link);  /* in the middle */
  check_order(&l, (int[]){10, 20, 30}, 3);
  ums_list_insert_after(&l, &v[2].link, &v[3].link);
  check_order(&l, (int[]){10, 20, 30, 40}, 4);
  CHECK(l.tail == &v[3].link);
}

int main(void) {
  RUN(test_push_and_pop);
  RUN(test_remove_anywhere);
  RUN(test_insert_after);
  return 0;
}
