(** * A small vector API.

    The table checker is written over these few operations only.  Each one has a plain
    list definition here; extraction maps exactly these constants to numpy implementations
    (govern/oracle/_prims.py), and a test compares every mapping with the definition below
    (extracted a second time without the mapping).  Nothing else is mapped except nat
    arithmetic. *)

From Coq Require Import List Arith Bool Lia.
Import ListNotations.

(** Vectors of naturals and boolean masks are wrapped so that their representation is
    only ever touched by the primitives below. *)
Record vec := Vec { vl : list nat }.
Record mask := Mask { ml : list bool }.

Definition vlen (a : vec) : nat := length (vl a).
Definition mlen (m : mask) : nat := length (ml m).

(** [0; 1; ...; n-1] *)
Definition viota (n : nat) : vec := Vec (seq 0 n).

(** [a[idx[0]]; a[idx[1]]; ...]; out-of-range positions read 0. *)
Definition vgather (a idx : vec) : vec := Vec (map (fun i => nth i (vl a) 0) (vl idx)).

(** The same for masks; out-of-range positions read false. *)
Definition mgather (m : mask) (idx : vec) : mask := Mask (map (fun i => nth i (ml m) false) (vl idx)).

(** Elementwise [if m then a else b], truncated to the shortest operand. *)
Definition vselect (m : mask) (a b : vec) : vec :=
  Vec (map (fun p : bool * (nat * nat) => if fst p then fst (snd p) else snd (snd p)) (combine (ml m) (combine (vl a) (vl b)))).

(** Elementwise sum, truncated to the shorter operand. *)
Definition vadd (a b : vec) : vec := Vec (map (fun p : nat * nat => fst p + snd p) (combine (vl a) (vl b))).

(** Elementwise equality, truncated to the shorter operand. *)
Definition veq (a b : vec) : mask := Mask (map (fun p : nat * nat => Nat.eqb (fst p) (snd p)) (combine (vl a) (vl b))).

(** Elementwise comparison with one number. *)
Definition vequals (a : vec) (x : nat) : mask := Mask (map (fun y => Nat.eqb y x) (vl a)).

(** 1 where the mask is false, 0 where it is true. *)
Definition vnotbit (m : mask) : vec := Vec (map (fun b : bool => if b then 0 else 1) (ml m)).

(** The largest entry (0 for the empty vector). *)
Definition vmax (a : vec) : nat := fold_left Nat.max (vl a) 0.

Definition vnth (a : vec) (i : nat) : nat := nth i (vl a) 0.
Definition mnth (m : mask) (i : nat) : bool := nth i (ml m) false.

Definition mall (m : mask) : bool := forallb (fun b : bool => b) (ml m).

Definition mor (a b : mask) : mask := Mask (map (fun p : bool * bool => orb (fst p) (snd p)) (combine (ml a) (ml b))).

Definition mcount (m : mask) : nat := length (filter (fun b : bool => b) (ml m)).

(** The positions where the mask is true, in increasing order. *)
Definition mwhere (m : mask) : vec :=
  Vec (map fst (filter snd (combine (seq 0 (length (ml m))) (ml m)))).

(** The mask of length n that is true exactly at the entries of idx. *)
Definition mmark (n : nat) (idx : vec) : mask :=
  Mask (map (fun i => existsb (Nat.eqb i) (vl idx)) (seq 0 n)).

(** The first position where the mask is false, or its length if there is none. *)
Fixpoint first_false (l : list bool) : nat :=
  match l with [] => 0 | b :: t => if b then S (first_false t) else 0 end.
Definition mfirst_false (m : mask) : nat := first_false (ml m).

(** ** Facts about the primitives *)

Lemma nth_map_lt {A B} (f : A -> B) l i d d' : i < length l -> nth i (map f l) d = f (nth i l d').
Proof.
  revert i; induction l as [|x l IH]; intros i H; simpl in *; [lia|].
  destruct i; auto. apply IH. lia.
Qed.

Lemma vlen_viota n : vlen (viota n) = n.
Proof. unfold vlen, viota; simpl. apply seq_length. Qed.

Lemma vnth_viota n i : i < n -> vnth (viota n) i = i.
Proof. intros H. unfold vnth, viota; simpl. rewrite seq_nth; auto. Qed.

Lemma vlen_vgather a idx : vlen (vgather a idx) = vlen idx.
Proof. unfold vlen, vgather; simpl. apply map_length. Qed.

Lemma vnth_vgather a idx i : i < vlen idx -> vnth (vgather a idx) i = vnth a (vnth idx i).
Proof.
  intros H. unfold vnth, vgather, vlen in *; simpl.
  rewrite nth_map_lt with (d' := 0) by (rewrite ?map_length, ?combine_length, ?seq_length; lia).
  reflexivity.
Qed.

Lemma mlen_mgather m idx : mlen (mgather m idx) = vlen idx.
Proof. unfold mlen, mgather, vlen; simpl. apply map_length. Qed.

Lemma mnth_mgather m idx i : i < vlen idx -> mnth (mgather m idx) i = mnth m (vnth idx i).
Proof.
  intros H. unfold mnth, mgather, vnth, vlen in *; simpl.
  rewrite nth_map_lt with (d' := 0) by (rewrite ?map_length, ?combine_length, ?seq_length; lia).
  reflexivity.
Qed.

Lemma combine_nth' {A B} (l : list A) (l' : list B) i da db :
  i < length l -> i < length l' -> nth i (combine l l') (da, db) = (nth i l da, nth i l' db).
Proof.
  revert l' i; induction l as [|x l IH]; intros l' i H1 H2; simpl in *; [lia|].
  destruct l' as [|y l']; simpl in *; [lia|].
  destruct i; simpl; auto. apply IH; lia.
Qed.

Lemma vlen_vselect m a b : mlen m = vlen a -> vlen a = vlen b -> vlen (vselect m a b) = vlen a.
Proof.
  unfold vlen, mlen, vselect; simpl; intros. rewrite map_length, !combine_length. lia.
Qed.

Lemma vnth_vselect m a b i : i < mlen m -> mlen m = vlen a -> vlen a = vlen b ->
  vnth (vselect m a b) i = if mnth m i then vnth a i else vnth b i.
Proof.
  unfold vlen, mlen, vselect, vnth, mnth; simpl; intros H1 H2 H3.
  rewrite nth_map_lt with (d' := (false, (0, 0))) by (rewrite ?map_length, ?combine_length, ?seq_length; lia).
  rewrite combine_nth' by (rewrite ?combine_length; lia).
  rewrite combine_nth' by lia. reflexivity.
Qed.

Lemma vlen_vadd a b : vlen a = vlen b -> vlen (vadd a b) = vlen a.
Proof. unfold vlen, vadd; simpl; intros. rewrite map_length, combine_length. lia. Qed.

Lemma vnth_vadd a b i : i < vlen a -> vlen a = vlen b -> vnth (vadd a b) i = vnth a i + vnth b i.
Proof.
  unfold vlen, vadd, vnth; simpl; intros H1 H2.
  rewrite nth_map_lt with (d' := (0, 0)) by (rewrite ?map_length, ?combine_length, ?seq_length; lia).
  rewrite combine_nth' by lia. reflexivity.
Qed.

Lemma mlen_veq a b : vlen a = vlen b -> mlen (veq a b) = vlen a.
Proof. unfold vlen, mlen, veq; simpl; intros. rewrite map_length, combine_length. lia. Qed.

Lemma mnth_veq a b i : i < vlen a -> vlen a = vlen b -> mnth (veq a b) i = Nat.eqb (vnth a i) (vnth b i).
Proof.
  unfold vlen, veq, vnth, mnth; simpl; intros H1 H2.
  rewrite nth_map_lt with (d' := (0, 0)) by (rewrite ?map_length, ?combine_length, ?seq_length; lia).
  rewrite combine_nth' by lia. reflexivity.
Qed.

Lemma mlen_vequals a x : mlen (vequals a x) = vlen a.
Proof. unfold mlen, vequals, vlen; simpl. apply map_length. Qed.

Lemma mnth_vequals a x i : i < vlen a -> mnth (vequals a x) i = Nat.eqb (vnth a i) x.
Proof.
  unfold vlen, vequals, vnth, mnth; simpl; intros H.
  rewrite nth_map_lt with (d' := 0) by (rewrite ?map_length, ?combine_length, ?seq_length; lia).
  reflexivity.
Qed.

Lemma vlen_vnotbit m : vlen (vnotbit m) = mlen m.
Proof. unfold vlen, vnotbit, mlen; simpl. apply map_length. Qed.

Lemma vnth_vnotbit m i : i < mlen m -> vnth (vnotbit m) i = if mnth m i then 0 else 1.
Proof.
  unfold mlen, vnotbit, vnth, mnth; simpl; intros H.
  rewrite nth_map_lt with (d' := false) by (rewrite ?map_length, ?combine_length, ?seq_length; lia).
  reflexivity.
Qed.

Lemma fold_max_ge l acc : acc <= fold_left Nat.max l acc /\ forall x, In x l -> x <= fold_left Nat.max l acc.
Proof.
  revert acc; induction l as [|y l IH]; intros acc; simpl.
  - split; [lia|tauto].
  - destruct (IH (Nat.max acc y)) as [H1 H2]. split; [lia|].
    intros x [<-|Hx]; [lia|auto].
Qed.

Lemma fold_max_in l acc : fold_left Nat.max l acc = acc \/ In (fold_left Nat.max l acc) l.
Proof.
  revert acc; induction l as [|y l IH]; intros acc; simpl; [auto|].
  destruct (IH (Nat.max acc y)) as [H|H]; [|auto].
  rewrite H. destruct (Nat.max_spec acc y) as [[_ E]|[_ E]]; rewrite E; auto.
Qed.

Lemma vmax_ge a i : i < vlen a -> vnth a i <= vmax a.
Proof.
  unfold vlen, vnth, vmax; intros H. apply fold_max_ge. apply nth_In; auto.
Qed.

Lemma vmax_lt a n : vmax a < n -> forall i, i < vlen a -> vnth a i < n.
Proof. intros H i Hi. pose proof (vmax_ge a i Hi). lia. Qed.

Lemma mall_spec m : mall m = true <-> forall i, i < mlen m -> mnth m i = true.
Proof.
  unfold mall, mlen, mnth. rewrite forallb_forall. split.
  - intros H i Hi. apply H, nth_In; auto.
  - intros H x Hx. apply In_nth with (d := false) in Hx. destruct Hx as [i [Hi <-]]. auto.
Qed.

Lemma mlen_mor a b : mlen a = mlen b -> mlen (mor a b) = mlen a.
Proof. unfold mlen, mor; simpl; intros. rewrite map_length, combine_length. lia. Qed.

Lemma mnth_mor a b i : i < mlen a -> mlen a = mlen b -> mnth (mor a b) i = orb (mnth a i) (mnth b i).
Proof.
  unfold mlen, mor, mnth; simpl; intros H1 H2.
  rewrite nth_map_lt with (d' := (false, false)) by (rewrite ?map_length, ?combine_length, ?seq_length; lia).
  rewrite combine_nth' by lia. reflexivity.
Qed.

Lemma mlen_mmark n idx : mlen (mmark n idx) = n.
Proof. unfold mlen, mmark; simpl. rewrite map_length. apply seq_length. Qed.

Lemma mnth_mmark n idx i : i < n -> mnth (mmark n idx) i = true <-> exists j, j < vlen idx /\ vnth idx j = i.
Proof.
  unfold mlen, mmark, mnth, vnth, vlen; simpl; intros H.
  rewrite nth_map_lt with (d' := 0) by (rewrite seq_length; lia).
  rewrite seq_nth by lia. simpl. rewrite existsb_exists. split.
  - intros [x [Hx E]]. apply Nat.eqb_eq in E. subst x.
    apply In_nth with (d := 0) in Hx. destruct Hx as [j [Hj E]]. eauto.
  - intros [j [Hj E]]. exists i. split; [|apply Nat.eqb_refl]. rewrite <- E. apply nth_In; auto.
Qed.

Lemma nth_shift {A} (b : A) l k i d : k < i -> nth (i - k) (b :: l) d = nth (i - S k) l d.
Proof. intros H. replace (i - k) with (S (i - S k)) by lia. reflexivity. Qed.

Lemma in_where_aux (l : list bool) k i :
  In i (map fst (filter snd (combine (seq k (length l)) l))) <-> k <= i /\ i < k + length l /\ nth (i - k) l false = true.
Proof.
  revert k; induction l as [|b l IH]; intros k; [simpl; lia|].
  cbn [length seq combine filter map snd fst].
  assert (Hsplit : forall P : Prop, (k = i -> P) -> (k < i -> P) -> k <= i -> P).
  { intros P Ha Hb Hle. destruct (Nat.eq_dec k i); [auto|apply Hb; lia]. }
  destruct b; cbn [filter snd map fst In]; rewrite IH; split.
  - intros [<-|(H1 & H2 & H3)].
    + rewrite Nat.sub_diag. split; [lia|split; [lia|reflexivity]].
    + rewrite nth_shift by lia. split; [lia|split; [lia|exact H3]].
  - intros (H1 & H2 & H3). apply (Hsplit _); auto; intros Hk. right.
    rewrite nth_shift in H3 by lia. split; [lia|split; [lia|exact H3]].
  - intros (H1 & H2 & H3). rewrite nth_shift by lia. split; [lia|split; [lia|exact H3]].
  - intros (H1 & H2 & H3). apply (Hsplit _); auto; intros Hk.
    + subst. rewrite Nat.sub_diag in H3. discriminate.
    + rewrite nth_shift in H3 by lia. split; [lia|split; [lia|exact H3]].
Qed.

Lemma in_mwhere m i : In i (vl (mwhere m)) <-> i < mlen m /\ mnth m i = true.
Proof.
  unfold mwhere, mlen, mnth; simpl. rewrite in_where_aux. rewrite Nat.sub_0_r.
  split; [intros (_ & H2 & H3); auto|intros (H2 & H3); split; [lia|auto]].
Qed.

Lemma vnth_mwhere m j : j < vlen (mwhere m) -> vnth (mwhere m) j < mlen m /\ mnth m (vnth (mwhere m) j) = true.
Proof. intros H. apply in_mwhere. unfold vnth, vlen in *. apply nth_In; auto. Qed.

Lemma mwhere_cover m i : i < mlen m -> mnth m i = true -> exists j, j < vlen (mwhere m) /\ vnth (mwhere m) j = i.
Proof.
  intros H1 H2. assert (Hin : In i (vl (mwhere m))) by (apply in_mwhere; auto).
  apply In_nth with (d := 0) in Hin. destruct Hin as [j [Hj E]]. exists j; auto.
Qed.

Lemma first_false_spec l : first_false l < length l -> nth (first_false l) l true = false.
Proof.
  induction l as [|b l IH]; simpl; [lia|]. destruct b; simpl; auto. intros H. apply IH. lia.
Qed.

Lemma first_false_all l : first_false l >= length l -> forall i, i < length l -> nth i l false = true.
Proof.
  induction l as [|b l IH]; simpl; [lia|]. destruct b; simpl; [|lia].
  intros H [|i] Hi; auto. apply IH; lia.
Qed.

(** ** Two more primitives for the table checker's speed

    [vrank] numbers the true entries of a mask; the checker never relies on how it is
    computed: it checks at run time that [vrank] inverts [mwhere] (see [pos_ok] in
    TableCheck.v).  [vjump] fuses the two gathers and the sum of a pointer-doubling round;
    [mallat], [vgeq] and [vstepok] fuse gathers with a comparison and a conjunction, so
    the mapped implementation can decide without building the gathered vectors (and stop at
    the first chunk that fails). *)

(** For each position, the number of true entries before it. *)
Definition vrank (m : mask) : vec :=
  Vec (map (fun i => length (filter (fun b : bool => b) (firstn i (ml m)))) (seq 0 (length (ml m)))).

(** One round of pointer doubling: [F] read through itself, and [D] plus [D] read through [F]. *)
Definition vjump (F D : vec) : vec * vec := (vgather F F, vadd D (vgather D F)).

(** Every entry of [m] read at the positions [idx] is true (out of range reads false). *)
Definition mallat (m : mask) (idx : vec) : bool := mall (mgather m idx).

(** [x[u[i]] = y[w[i]]] at every position of the shorter of [u] and [w]. *)
Definition vgeq (x u y w : vec) : bool := mall (veq (vgather x u) (vgather y w)).

(** The steps of a normal-form and depth witness along [r]: [F] is constant along [r], and
    [D] grows by one along [r] exactly where [m] is false ([D s = D (r s) + 1], else
    [D s = D (r s)]). *)
Definition vstepok (m : mask) (r F D : vec) : bool :=
  mall (veq F (vgather F r)) && mall (veq D (vadd (vgather D r) (vnotbit m))).

Lemma vgeq_spec x u y w : vlen u = vlen w ->
  (vgeq x u y w = true <-> forall i, i < vlen u -> vnth x (vnth u i) = vnth y (vnth w i)).
Proof.
  intros Hl. unfold vgeq. rewrite mall_spec.
  assert (Hm : mlen (veq (vgather x u) (vgather y w)) = vlen u).
  { rewrite mlen_veq; rewrite !vlen_vgather; auto. }
  rewrite Hm. split.
  - intros H i Hi. specialize (H i Hi). rewrite mnth_veq in H by (rewrite ?vlen_vgather; auto).
    apply Nat.eqb_eq in H. rewrite !vnth_vgather in H by lia. exact H.
  - intros H i Hi. rewrite mnth_veq by (rewrite ?vlen_vgather; auto).
    apply Nat.eqb_eq. rewrite !vnth_vgather by lia. apply H; auto.
Qed.

Lemma mnth_lt m i : mnth m i = true -> i < mlen m.
Proof.
  unfold mnth, mlen. intros H. destruct (Nat.lt_ge_cases i (length (ml m))) as [Hl|Hl]; auto.
  rewrite nth_overflow in H by lia. discriminate.
Qed.
